"""Backend configuration: the seed contract's fields and defaults, plus tokensampler's own."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["SamplingBackendConfig", "DEFAULT_RANDOM_SEED", "LOGPROBS_MODES"]

DEFAULT_RANDOM_SEED = 48
MAX_BS = 1 << 16
MAX_DRAFT_TOKENS = 1 << 10
MAX_ROWS = 1 << 20
MAX_POOL = 1 << 20
MAX_BIAS_ENTRIES = 1 << 16
LOGPROBS_MODES = ("raw", "processed")


@dataclass
class SamplingBackendConfig:
    # Accepted for the contract's sake and ignored: NaN logits always count as -inf (DESIGN §3.1).
    enable_nan_detection: bool = False
    # Sampled-token logprobs (next_token_logprobs); off by default so the fast path does no extra work.
    enable_output_logprobs: bool = False
    # Sizing of buffers allocated once at construction (no allocation per step).
    max_bs: int = 1
    max_draft_tokens_per_req: int = 1
    # Per-slot state is indexed by req_pool_idx in [0, max_req_pool_size]; row 0 is neutral.
    max_req_pool_size: int = 0
    vocab_size: int = 0
    device: torch.device | str | None = None
    # Type-checked and otherwise unused: seeds come from SamplingParams.seed, or are derived
    # from the request id (params.derive_seed), so they do not depend on the backend.
    random_seed: int = DEFAULT_RANDOM_SEED
    # Attention-TP group for sampler-output broadcast (rank tp_group[0] wins).
    tp_group: tuple[int, ...] | None = None
    enable_tp_sync: bool = True

    # tokensampler additions.
    # "raw": log-softmax of the raw logits; "processed": of the distribution actually sampled.
    logprobs_mode: str = "raw"
    # N > 0 fills next_token_top_logprobs_val/idx with the N largest raw logprobs per row.
    top_logprobs_num: int = 0
    # Distinct tokens (prompt + output) a slot's penalty history holds (gumbel_full).
    penalty_history_capacity: int = 4096
    # Logit-bias entries per request (gumbel_full).
    logit_bias_capacity: int = 256
    # Accept SamplingBatchInfo.token_bitmask (grammar masks). Backends that mask outside the
    # kernels (the FlashInfer adapters; greedy with logprobs) allocate, once, an fp32 copy of the
    # logits rows and the unpacked bits (~9 bytes per row and token); the others nothing.
    enable_token_bitmask: bool = False

    @property
    def pool_rows(self) -> int:
        return self.max_req_pool_size + 1

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device if self.device is not None else "cpu")

    def validate(self) -> "SamplingBackendConfig":
        """Raises ValueError naming the field and value of anything a backend cannot size from."""
        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ValueError(msg)

        for name in ("max_bs", "max_draft_tokens_per_req", "max_req_pool_size", "vocab_size",
                     "top_logprobs_num", "penalty_history_capacity", "logit_bias_capacity",
                     "random_seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name}={value!r} must be an int, got {type(value).__name__}")

        for name in ("enable_nan_detection", "enable_output_logprobs", "enable_tp_sync",
                     "enable_token_bitmask"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise TypeError(f"{name}={value!r} must be a bool, got {type(value).__name__}")
        if self.tp_group is not None:
            group = self.tp_group
            if isinstance(group, (str, bytes)) or not isinstance(group, (list, tuple)) or any(
                    isinstance(r, bool) or not isinstance(r, int) for r in group):
                raise TypeError(f"tp_group={group!r} must be None or a list of int ranks")
            need(len(set(group)) == len(group) and all(r >= 0 for r in group),
                 f"tp_group={group!r} must hold distinct ranks >= 0")

        # Bounds keep every row and slot index in int32 and the buffers allocatable.
        need(1 <= self.max_bs <= MAX_BS, f"max_bs={self.max_bs!r} must be in [1, {MAX_BS}]")
        need(1 <= self.max_draft_tokens_per_req <= MAX_DRAFT_TOKENS,
             f"max_draft_tokens_per_req={self.max_draft_tokens_per_req!r} must be in "
             f"[1, {MAX_DRAFT_TOKENS}]")
        need(self.max_bs * self.max_draft_tokens_per_req <= MAX_ROWS,
             f"max_bs * max_draft_tokens_per_req = {self.max_bs * self.max_draft_tokens_per_req} "
             f"rows is more than {MAX_ROWS}")
        need(0 <= self.max_req_pool_size < MAX_POOL,
             f"max_req_pool_size={self.max_req_pool_size!r} must be in [0, {MAX_POOL})")
        need(isinstance(self.vocab_size, int) and 1 <= self.vocab_size <= 2**20,
             f"vocab_size={self.vocab_size!r} must be an int in [1, 2^20]")
        need(self.logprobs_mode in LOGPROBS_MODES,
             f"logprobs_mode={self.logprobs_mode!r} must be one of {LOGPROBS_MODES}")
        need(isinstance(self.top_logprobs_num, int) and 0 <= self.top_logprobs_num <= self.vocab_size,
             f"top_logprobs_num={self.top_logprobs_num!r} must be an int in [0, vocab_size]")
        need(isinstance(self.penalty_history_capacity, int) and self.penalty_history_capacity >= 0,
             f"penalty_history_capacity={self.penalty_history_capacity!r} must be an int >= 0")
        need(0 <= self.logit_bias_capacity <= MAX_BIAS_ENTRIES,
             f"logit_bias_capacity={self.logit_bias_capacity!r} must be in [0, {MAX_BIAS_ENTRIES}]")
        try:
            device = self.torch_device
        except (RuntimeError, TypeError) as exc:
            raise ValueError(f"device={self.device!r} is not a torch device: {exc}") from None
        need(device.type in ("cpu", "cuda"), f"device={self.device!r} must be cpu or cuda")
        return self
