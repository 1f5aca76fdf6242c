"""Per-step inputs and outputs of a backend (DESIGN §1)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["SamplingBatchInfo", "LogitsProcessorOutput"]


@dataclass
class SamplingBatchInfo:
    # int32 [bs]: each request's pool slot.
    req_pool_indices: torch.Tensor
    # int32 [pool_rows]: tokens already in each slot's sequence (position t of DESIGN §3).
    valid_cache_lengths: torch.Tensor
    vocab_size: int
    device: torch.device | str
    # Accepted and ignored: the kernels find greedy rows from the slots' parameters.
    is_all_greedy: bool = False
    # float [bs, n-1, V]: draft probabilities; switches verify to rejection sampling.
    draft_probs: torch.Tensor | None = None
    # int32 [rows, ceil(V/32)] in xgrammar's layout (bit j of word w allows token 32w + j; rows =
    # bs for sample, bs * n for verify): disallowed tokens are -inf before every rule (DESIGN
    # §3.0). Needs config.enable_token_bitmask.
    token_bitmask: torch.Tensor | None = None


@dataclass
class LogitsProcessorOutput:
    # [rows, V] fp32 / bf16 / fp16 logits; rows = bs (sample) or bs * n (verify).
    next_token_logits: torch.Tensor
    # Filled by the backend when config.enable_output_logprobs: float32 [rows].
    next_token_logprobs: torch.Tensor | None = None
    # Filled when config.top_logprobs_num > 0: float32 / int64 [rows, N].
    next_token_top_logprobs_val: torch.Tensor | None = None
    next_token_top_logprobs_idx: torch.Tensor | None = None
    next_token_token_ids_logprobs_val: torch.Tensor | None = None
    next_token_token_ids_logprobs_idx: torch.Tensor | None = None
