"""The one validation of a step's host-side inputs (DESIGN §5).

Everything a caller hands `prepare_step`, `sample` and `verify` is checked here, before any slot
or output is written: a refusal is a ValueError / TypeError naming the field and its value and
leaves the backend as it was. The native code keeps only bounds checks that protect memory (a
backstop for direct callers of the ops), so no rule lives in two places.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Sequence

import torch

from ..batch import SamplingBatchInfo
from ..bitmask import bitmask_words
from ..config import SamplingBackendConfig
from ..params import SamplingParams

__all__ = ["StepRequests", "check_step", "check_batch_info", "check_candidates",
           "check_draft_probs", "check_params", "check_prompt", "check_token_bitmask",
           "check_capture_shape", "check_dense", "check_memory"]

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_INT_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)


def _index(value, name: str) -> int:
    """An integer argument: int or an integer scalar (numpy), never bool, float or str."""
    if isinstance(value, bool):
        raise TypeError(f"{name}={value!r} must be an int, not bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name}={value!r} must be an int, got {type(value).__name__}") from None


def _tokens_per_req(config: SamplingBackendConfig, value) -> None:
    """num_tokens_per_req: an int in [1, max_draft_tokens_per_req]."""
    n = _index(value, "num_tokens_per_req")
    if not 1 <= n <= config.max_draft_tokens_per_req:
        raise ValueError(f"num_tokens_per_req={n} is outside [1, "
                         f"max_draft_tokens_per_req={config.max_draft_tokens_per_req}]")


def _sequence(value, name: str) -> Sequence:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{name} must be a list, got {type(value).__name__}")
    return value


class StepRequests:
    """prepare_step's per-request lists after validation: request ids as str, slots as int."""

    __slots__ = ("rids", "slots", "params", "prompts")

    def __init__(self, rids, slots, params, prompts):
        self.rids, self.slots, self.params, self.prompts = rids, slots, params, prompts


def check_step(config: SamplingBackendConfig, request_ids, request_pool_indices,
               sampling_params_list, num_tokens_per_req, prompt_token_ids) -> StepRequests:
    """Shapes, types, ranges and uniqueness of prepare_step's arguments (not the params' fields:
    SamplingParams.normalize checks those)."""
    request_ids = _sequence(request_ids, "request_ids")
    request_pool_indices = _sequence(request_pool_indices, "request_pool_indices")
    sampling_params_list = _sequence(sampling_params_list, "sampling_params_list")
    n = len(request_ids)
    if not n == len(request_pool_indices) == len(sampling_params_list) or (
            prompt_token_ids is not None and len(_sequence(prompt_token_ids, "prompt_token_ids")) != n):
        raise ValueError(
            f"prepare_step expects aligned per-request lists; got request_ids={n}, "
            f"request_pool_indices={len(request_pool_indices)}, "
            f"sampling_params_list={len(sampling_params_list)}"
            + ("" if prompt_token_ids is None else f", prompt_token_ids={len(prompt_token_ids)}"))
    if n > config.max_bs:
        raise ValueError(f"prepare_step got {n} requests, more than max_bs={config.max_bs}")
    _tokens_per_req(config, num_tokens_per_req)
    # Whole-list tests first (a steady step of 512 requests passes them in ~0.1 ms); the
    # per-entry loops below run only to name what failed.
    rids = list(map(str, request_ids))
    try:
        "".join(rids).encode("utf-8")  # the slot manager's keys and derived seeds read UTF-8
    except UnicodeEncodeError:
        for i, rid in enumerate(rids):
            try:
                rid.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(f"request_ids[{i}]={rid!r} is not valid Unicode text") from None
    if len(set(rids)) != n:
        dup = next(r for r in rids if rids.count(r) > 1)
        raise ValueError(f"request_ids holds {dup!r} twice: one request per row of a step")
    slots = list(request_pool_indices)
    if not all(type(s) is int for s in slots):
        slots = [_index(v, f"request_pool_indices[{i}]") for i, v in enumerate(slots)]
    if n and (min(slots) < 0 or max(slots) >= config.pool_rows or len(set(slots)) != n):
        owner_of = {}
        for i, slot in enumerate(slots):
            if not 0 <= slot < config.pool_rows:
                raise ValueError(f"request_pool_indices[{i}]={slot} is outside [0, "
                                 f"{config.pool_rows}) for rid={rids[i]!r}")
            if slot in owner_of:
                raise ValueError(f"request_pool_indices[{i}]={slot} is given to two requests "
                                 f"in one step ({owner_of[slot]!r}, {rids[i]!r})")
            owner_of[slot] = rids[i]
    return StepRequests(rids, slots, list(sampling_params_list),
                        None if prompt_token_ids is None else list(prompt_token_ids))


def check_params(sp, rid: str, vocab_size: int) -> SamplingParams:
    """One request's SamplingParams, normalised (SamplingParams.normalize checks every field)."""
    if not isinstance(sp, SamplingParams):
        raise TypeError(f"sampling_params_list entry for rid={rid!r} is a {type(sp).__name__}, "
                        f"not SamplingParams")
    return sp.normalize(vocab_size)


def check_prompt(prompt, i: int, vocab_size: int) -> list[int] | None:
    """prompt_token_ids[i] as a list of ints in [0, vocab_size), or None."""
    if prompt is None:
        return None
    name = f"prompt_token_ids[{i}]"
    if isinstance(prompt, torch.Tensor):
        if prompt.dtype not in _INT_DTYPES or prompt.dim() != 1:
            raise TypeError(f"{name} must be a 1-D integer tensor or a list of ints, got "
                            f"{prompt.dtype} of shape {tuple(prompt.shape)}")
        check_dense(prompt, name)
        if prompt.device.type == "meta":
            raise ValueError(f"{name} is a meta tensor: it holds no token ids")
        tokens = prompt.tolist()
    elif set(map(type, _sequence(prompt, name))) <= {int}:  # plain ints: no per-token checks
        tokens = list(prompt)
    else:
        tokens = [_index(t, name) for t in prompt]
    if tokens and not 0 <= min(tokens) <= max(tokens) < vocab_size:
        bad = next(t for t in tokens if not 0 <= t < vocab_size)
        raise ValueError(f"{name} holds token {bad}, outside [0, {vocab_size})")
    return tokens


def check_dense(t: torch.Tensor, name: str) -> None:
    """A tensor the kernels can read through its strides (not sparse, not nested)."""
    if t.layout != torch.strided or t.is_nested:
        raise TypeError(f"{name} must be a dense (strided) tensor, got layout {t.layout}")


def _tensor(t, name: str, device: torch.device, *, dtypes=(torch.int32,)) -> torch.Tensor:
    """A tensor argument: a dense tensor (TypeError), of one of `dtypes` (TypeError), on the
    backend's device (ValueError); shapes are the caller's."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
    check_dense(t, name)
    if t.dtype not in dtypes:
        raise TypeError(f"{name} must be {' or '.join(str(d) for d in dtypes)}, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, but this backend's config.device is {device}")
    return t


def check_batch_info(config: SamplingBackendConfig, device: torch.device,
                     info: SamplingBatchInfo, bs: int) -> None:
    if not isinstance(info, SamplingBatchInfo):
        raise TypeError(f"sampling_info must be a SamplingBatchInfo, got {type(info).__name__}")
    if _index(info.vocab_size, "sampling_info.vocab_size") != config.vocab_size:
        raise ValueError(f"sampling_info.vocab_size={info.vocab_size!r} differs from "
                         f"config.vocab_size={config.vocab_size}")
    try:
        info_device = torch.device(info.device)
    except (RuntimeError, TypeError):
        raise ValueError(f"sampling_info.device={info.device!r} is not a torch device") from None
    if info_device.type != device.type or (info_device.index is not None
                                           and info_device.index != device.index):
        raise ValueError(f"sampling_info.device={info.device!r} differs from this backend's "
                         f"config.device {device}")
    pool = _tensor(info.req_pool_indices, "req_pool_indices", device)
    if pool.dim() != 1 or pool.size(0) < bs:
        raise ValueError(f"req_pool_indices must be 1-D with at least {bs} entries, got shape "
                         f"{tuple(pool.shape)}")
    lengths = _tensor(info.valid_cache_lengths, "valid_cache_lengths", device)
    if lengths.dim() != 1 or lengths.size(0) < config.pool_rows:
        raise ValueError(f"valid_cache_lengths must be 1-D with one entry per pool row "
                         f"({config.pool_rows}), got shape {tuple(lengths.shape)}")


def check_candidates(candidates, device: torch.device, max_n: int) -> torch.Tensor:
    """candidates as a contiguous int32 [bs, n] tensor (int64 is narrowed: ids fit int32)."""
    candidates = _tensor(candidates, "candidates", device, dtypes=(torch.int32, torch.int64))
    if candidates.dim() != 2 or candidates.size(1) < 1:
        raise ValueError(f"candidates must be [bs, n] with n >= 1, got shape "
                         f"{tuple(candidates.shape)}")
    if candidates.size(1) > max_n:
        raise ValueError(f"candidates has {candidates.size(1)} tokens per request, more than "
                         f"max_draft_tokens_per_req={max_n}")
    if candidates.dtype == torch.int64:
        # Ids outside int32 cannot be tokens; saturate so they stay outside [0, V) (rejected).
        candidates = candidates.clamp(-2**31, 2**31 - 1).to(torch.int32)
    return candidates.contiguous()


def check_draft_probs(draft_probs, device: torch.device, bs: int, n: int, vocab: int) -> None:
    _tensor(draft_probs, "draft_probs", device, dtypes=_FLOAT_DTYPES)
    if tuple(draft_probs.shape) != (bs, n - 1, vocab):
        raise ValueError(f"draft_probs must be [bs, n-1, V] = [{bs}, {n - 1}, {vocab}], got "
                         f"{tuple(draft_probs.shape)}")


def check_token_bitmask(config: SamplingBackendConfig, device: torch.device, bitmask,
                        rows: int) -> None:
    """sampling_info.token_bitmask: int32 [rows, ceil(V/32)] with contiguous rows (the kernels
    read it in place) on the backend's device, given to a backend built with
    enable_token_bitmask."""
    if isinstance(bitmask, torch.Tensor) and not config.enable_token_bitmask:
        raise ValueError("token_bitmask was given, but this backend was built with "
                         "config.enable_token_bitmask=False")
    _tensor(bitmask, "token_bitmask", device)
    words = bitmask_words(config.vocab_size)
    if tuple(bitmask.shape) != (rows, words):
        raise ValueError(f"token_bitmask must be [rows, ceil(vocab_size/32)] = [{rows}, {words}], "
                         f"got {tuple(bitmask.shape)}")
    if bitmask.stride(1) != 1:
        raise ValueError(f"token_bitmask rows must be contiguous, got strides {bitmask.stride()}")


def check_capture_shape(config: SamplingBackendConfig, bs, num_tokens_per_req) -> None:
    """The shape a CUDA graph is captured or replayed for: bs in [1, max_bs] (None: not asked),
    num_tokens_per_req in [1, max_draft_tokens_per_req]."""
    _tokens_per_req(config, num_tokens_per_req)
    if bs is not None and not 1 <= _index(bs, "bs") <= config.max_bs:
        raise ValueError(f"bs={bs} is outside [1, max_bs={config.max_bs}]")


def check_memory(device: torch.device, needs: dict[str, int]) -> None:
    """Refuses (ValueError) a config whose buffers (name -> bytes) exceed the memory the device
    that holds them can still give: said before any allocation, where the allocator's failure
    inside the extension would end the process on some builds. On a GPU that is its free memory
    plus what torch's caching allocator holds unused (an engine builds the sampler after its
    weights and KV cache): an upper bound, so a config under it can still fail to allocate
    (fragmented cached blocks; torch's OutOfMemoryError from the Python allocations). On the
    CPU, the machine's physical memory."""
    if device.type == "cuda":
        free = (torch.cuda.mem_get_info(device)[0] + torch.cuda.memory_reserved(device)
                - torch.cuda.memory_allocated(device))
        has = "has free"
    else:
        free = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        has = "has"
    need = sum(needs.values())
    if need > free:
        detail = ", ".join(f"{name}: {size / 2**30:.1f} GiB" for name, size in needs.items())
        raise ValueError(f"this config needs {need / 2**30:.1f} GiB on {device} ({detail}), more "
                         f"than the {free / 2**30:.1f} GiB it {has}")
