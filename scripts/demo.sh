#!/usr/bin/env bash
# The main job: install and build (scripts/setup_env.sh), then serve the SmolLM2 demo through
# tokensampler with continuous batching and speculative decoding (CPU; the GPU when present,
# followed by the sampler benchmark against FlashInfer/torch).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
. .venv/bin/activate
if python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  python -m tokensampler.demo --speculative --device cuda "$@"
  python bench/benchmark.py --bs 1 32 128 512 --json bench/out/bench.json
else
  python -m tokensampler.demo --speculative "$@"
fi
