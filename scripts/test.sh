#!/usr/bin/env bash
# Installs everything the tests need (scripts/setup_env.sh) and runs the test suite.
# GPU tests (marked `cuda`) skip without a GPU; the model tests run the SmolLM2 demo model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
. .venv/bin/activate
# Run from a copy-free location so the installed wheel, not the source tree, is imported.
set +e
python -m pytest -q -p no:cacheprovider tests "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"
