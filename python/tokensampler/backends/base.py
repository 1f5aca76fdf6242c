"""The SamplingBackend contract (tokenspeed's seed base.py), shared plumbing for every backend."""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from typing import NamedTuple, Sequence

import torch
import torch.distributed as dist

from .. import _C
from ..batch import LogitsProcessorOutput, SamplingBatchInfo
from ..bitmask import TokenBitmaskScratch, apply_token_bitmask
from ..build import check_device_supported
from ..config import LOGPROBS_MODES, SamplingBackendConfig
from ..graphs import CUDA_GRAPH_VARIANT_DEFAULT
from ..params import SamplingParams
from . import checks

__all__ = ["SamplingBackend"]


class RowViews(NamedTuple):
    """Views of the first k rows of a backend's per-row buffers (None: not allocated)."""
    tokens: torch.Tensor              # sample's tokens, verify's predict (_packed row 0)
    accept: torch.Tensor              # verify's accept lengths (_packed row 1)
    ones: torch.Tensor                # sample's lengths (_packed row 2)
    target: torch.Tensor              # verify's target tokens
    invalid: torch.Tensor
    logprobs: torch.Tensor | None
    top_values: torch.Tensor | None
    top_ids: torch.Tensor | None


class SamplingBackend(ABC):
    """Single-step sampling and speculative verification over a batch of requests.

    `sample` returns (tokens int32[bs], accept_lengths int32[bs] of ones) and `verify` returns
    (predict int32[bs*n], accept_length int32[bs]). Both are views of buffers the backend
    allocates once at construction: they are overwritten by the next call, which is what makes
    the calls CUDA-graph capturable, and a call of the same size returns the same view
    objects. Copy them if you keep them; do not resize them in place.
    """

    def __init__(self, config: SamplingBackendConfig) -> None:
        if not isinstance(config, SamplingBackendConfig):
            raise TypeError(f"config must be a SamplingBackendConfig, got {type(config).__name__}")
        # A copy: buffers are sized from it, so a later change to the caller's object must not
        # reach this backend.
        config = copy.deepcopy(config).validate()
        self.config = config
        device = config.torch_device
        if device.type == "cpu":
            device = torch.device("cpu")  # "cpu:0" is the one CPU device tensors report as "cpu"
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device={config.device!r}: no CUDA device is available")
        if device.type == "cuda" and device.index is None:
            # "cuda" means the current device; compare against tensors' explicit "cuda:N".
            device = torch.device("cuda", torch.cuda.current_device())
        # A build without CUDA kernels, or without code for this GPU's architecture, fails
        # here (naming the GPU), not at the first kernel launch.
        check_device_supported(device)
        self.device = device
        # Everything the config sizes is refused at once, before anything is allocated.
        checks.check_memory(device, self._planned_bytes(config))
        staged = self._planned_host_bytes(config)
        if device.type != "cpu" and staged:
            checks.check_memory(torch.device("cpu"), staged)
        rows = config.max_bs * config.max_draft_tokens_per_req
        # Row 0 of `_packed` holds output tokens, row 1 verify's accept lengths, row 2 sample's
        # lengths: ones written here once, so a sample step launches no fill. One D2H copy moves
        # tokens and lengths (`_sample_outputs`, `_verify_outputs`).
        self._packed = torch.zeros((3, rows), dtype=torch.int32, device=self.device)
        self._packed[2].fill_(1)
        self._target = torch.zeros(rows, dtype=torch.int32, device=self.device)
        # Per-row flag of DESIGN §3.1: the row had no finite and no +inf logit.
        self.invalid_rows = torch.zeros(rows, dtype=torch.bool, device=self.device)
        self._logprobs = (torch.zeros(rows, dtype=torch.float32, device=self.device)
                          if config.enable_output_logprobs else None)
        n_top = config.top_logprobs_num
        self._top_values = (torch.zeros((rows, n_top), dtype=torch.float32, device=self.device)
                            if n_top > 0 else None)
        self._top_ids = (torch.zeros((rows, n_top), dtype=torch.int64, device=self.device)
                         if n_top > 0 else None)
        # Masked-logits buffers of DESIGN §3.0, only when the engine will pass token_bitmask
        # and this backend reads masked logits outside tokensampler's kernels.
        self._bitmask_scratch = (TokenBitmaskScratch(rows, config.vocab_size, self.device)
                                 if config.enable_token_bitmask and self._reads_masked_logits()
                                 else None)
        # Scratch of the CUDA sampling kernels, sized once from the config: no step allocates.
        # Zeroed once: it holds the single-launch kernel's per-row tickets, which must start at
        # zero (each launch leaves them at zero again; csrc/cuda/workspace.h).
        self._workspace = (torch.zeros(_C.sample_rows_workspace_bytes(rows), dtype=torch.uint8,
                                       device=self.device)
                           if self._uses_kernel_workspace(config) else None)
        self._logprobs_mode = LOGPROBS_MODES.index(config.logprobs_mode)  # the kernels' int
        self._row_views: dict[int, RowViews] = {}
        self._checked_params: dict[str, SamplingParams] = {}  # rid -> the object last validated
        self._tp_group = None
        self._tp_src = None
        if config.enable_tp_sync and config.tp_group is not None and len(config.tp_group) > 1:
            if not dist.is_initialized():
                raise ValueError(f"tp_group={config.tp_group} needs torch.distributed to be initialised")
            own = tuple(config.tp_group)
            if dist.get_rank() not in own:
                raise ValueError(f"tp_group={config.tp_group} does not hold this rank "
                                 f"({dist.get_rank()})")
            # new_group is collective over the whole world, in the same order on every rank:
            # every rank creates every rank's group (attention-DP has several) and keeps its own.
            groups = [None] * dist.get_world_size()
            dist.all_gather_object(groups, own)
            for group in sorted(set(groups)):
                handle = dist.new_group(list(group))
                if group == own:
                    self._tp_group = handle
            self._tp_src = own[0]

    def _planned_bytes(self, config: SamplingBackendConfig) -> dict[str, int]:
        """Bytes of the buffers this backend allocates on its device from `config`, by what
        sizes them (subclasses add theirs)."""
        rows = config.max_bs * config.max_draft_tokens_per_req
        # packed outputs (3 int32), target (int32), invalid (bool), logprobs (fp32), top-N
        # (fp32 values, int64 ids)
        planned = {"the per-row outputs (max_bs * max_draft_tokens_per_req, top_logprobs_num)":
                   rows * (21 + 12 * config.top_logprobs_num)}
        if config.enable_token_bitmask and self._reads_masked_logits():
            planned["the masked-logits scratch (enable_token_bitmask, vocab_size)"] = (
                TokenBitmaskScratch.nbytes(rows, config.vocab_size))
        if self._uses_kernel_workspace(config):
            planned["the kernels' workspace (max_bs * max_draft_tokens_per_req)"] = (
                _C.sample_rows_workspace_bytes(rows))
        return planned

    def _uses_kernel_workspace(self, config: SamplingBackendConfig) -> bool:
        """Whether this backend's steps can run the CUDA sampling kernels' multi-block paths,
        which read a workspace (`_workspace`). Default: no."""
        return False

    def _planned_host_bytes(self, config: SamplingBackendConfig) -> dict[str, int]:
        """Host bytes a backend on a GPU stages its buffers through. Default: none."""
        return {}

    # ---- step preparation (host side, outside CUDA graphs) ----
    def prepare_step(self, request_ids: Sequence[str], request_pool_indices: Sequence[int],
                     sampling_params_list: Sequence[SamplingParams], num_tokens_per_req: int = 1,
                     *, prompt_token_ids: Sequence[Sequence[int] | None] | None = None) -> None:
        """Flip detection and per-step route selection. Stateless backends only validate, each
        SamplingParams object once (as the stateful ones read it: when first brought)."""
        step = checks.check_step(self.config, request_ids, request_pool_indices,
                                 sampling_params_list, num_tokens_per_req, prompt_token_ids)
        checked = {}
        for rid, sp in zip(step.rids, step.params):
            if self._checked_params.get(rid) is not sp:
                self._check_applicable(checks.check_params(sp, rid, self.config.vocab_size), rid)
            checked[rid] = sp
        self._checked_params = checked

    def _check_applicable(self, sp: SamplingParams, rid: str) -> None:
        """Refuses (ValueError) a normalised field this stateless backend cannot honour."""

    # ---- CUDA-graph capture: the shape is checked here, the subclasses' hooks do the rest ----
    def prepare_capture(self, bs: int, num_tokens_per_req: int = 1) -> None:
        """Per-step refill for capture warm-up."""
        checks.check_capture_shape(self.config, bs, num_tokens_per_req)
        self._prepare_capture(bs, num_tokens_per_req)

    def cuda_graph_capture_variants(self, num_tokens_per_req: int) -> tuple[str, ...]:
        checks.check_capture_shape(self.config, None, num_tokens_per_req)
        return self._capture_variants(num_tokens_per_req)

    def prepare_capture_variant(self, bs: int, num_tokens_per_req: int, variant: str) -> None:
        checks.check_capture_shape(self.config, bs, num_tokens_per_req)
        if variant not in self._capture_variants(num_tokens_per_req):
            raise ValueError(f"Unsupported CUDA graph variant: {variant!r}")
        self._prepare_capture_variant(bs, num_tokens_per_req, variant)

    def cuda_graph_replay_variant(self, num_tokens_per_req: int) -> str:
        checks.check_capture_shape(self.config, None, num_tokens_per_req)
        return self._replay_variant(num_tokens_per_req)

    def _prepare_capture(self, bs: int, num_tokens_per_req: int) -> None:
        """Default: nothing to refill."""

    def _capture_variants(self, num_tokens_per_req: int) -> tuple[str, ...]:
        return (CUDA_GRAPH_VARIANT_DEFAULT,)

    def _prepare_capture_variant(self, bs: int, num_tokens_per_req: int, variant: str) -> None:
        self._prepare_capture(bs, num_tokens_per_req)

    def _replay_variant(self, num_tokens_per_req: int) -> str:
        return CUDA_GRAPH_VARIANT_DEFAULT

    def reset_capture_state(self) -> None:
        """Clears what capture warm-up (which runs against pool row 0) may have dirtied."""

    def configure_dp_sampling(self, runtime) -> None:
        """DP sampling is not implemented by tokensampler's backends; nothing to configure."""

    # ---- outputs ----
    def _rows(self, k: int) -> RowViews:
        """Views of the per-row buffers' first k rows, made once per k: a slice costs ~2 us of
        host time, and an eager step takes four to eight of them."""
        views = self._row_views.get(k)
        if views is None:
            views = self._row_views[k] = RowViews(
                self._packed[0, :k], self._packed[1, :k], self._packed[2, :k],
                self._target[:k], self.invalid_rows[:k], *(None if t is None else t[:k] for t in (
                    self._logprobs, self._top_values, self._top_ids)))
        return views

    def _sample_outputs(self, bs: int) -> tuple[torch.Tensor, torch.Tensor]:
        """sample's (tokens, lengths) views of the packed buffer; the lengths are all 1."""
        views = self._rows(bs)
        return views.tokens, views.ones

    def _verify_outputs(self, rows: int, bs: int) -> tuple[torch.Tensor, torch.Tensor]:
        """verify's (predict, accept_length) views of the packed buffer."""
        return self._rows(rows).tokens, self._rows(bs).accept

    def get_packed_output_d2h(self, output_tokens: torch.Tensor, output_lengths: torch.Tensor
                              ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """CPU copies of (tokens, lengths) from one device-to-host copy, when both are the
        views this backend returned; None otherwise."""
        base = self._packed
        outputs = (output_tokens, output_lengths)
        for name, t in zip(("output_tokens", "output_lengths"), outputs):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
        if any(t.untyped_storage().data_ptr() != base.untyped_storage().data_ptr()
               or t.dtype != base.dtype or t.dim() != 1 or t.stride(0) != 1
               or t.storage_offset() % base.stride(0) != 0 or t.numel() > base.size(1)
               for t in outputs):
            return None
        host = base[:, :max(t.numel() for t in outputs)].to("cpu")
        # each view is the head of one row of `_packed` (tokens, accept or sample lengths)
        return tuple(host[t.storage_offset() // base.stride(0), :t.numel()] for t in outputs)

    def maybe_broadcast(self, *tensors: torch.Tensor) -> None:
        """Broadcasts the tensors from tp_group[0] so all attention-TP ranks agree. No-op
        without a TP group. Outputs this backend returned (tokens, accept lengths) live in one
        packed buffer and travel in a single collective; anything else is broadcast on its
        own. Graph-safe: collectives only, no host sync."""
        if self._tp_group is None:
            return
        packed = self._packed.untyped_storage().data_ptr()
        own = [t for t in tensors if t.untyped_storage().data_ptr() == packed]
        if own:
            dist.broadcast(self._packed, src=self._tp_src, group=self._tp_group)
        for t in tensors:
            if t.untyped_storage().data_ptr() != packed:
                dist.broadcast(t, src=self._tp_src, group=self._tp_group)

    # ---- the work ----
    @abstractmethod
    def sample(self, logits_output: LogitsProcessorOutput, sampling_info: SamplingBatchInfo
               ) -> tuple[torch.Tensor, torch.Tensor]: ...

    @abstractmethod
    def verify(self, logits_output: LogitsProcessorOutput, sampling_info: SamplingBatchInfo,
               candidates: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...

    # ---- shared checks ----
    def _reads_masked_logits(self) -> bool:
        """Whether this backend needs logits masked by sampling_info.token_bitmask (DESIGN §3.0)
        in buffers of its own (_masked). tokensampler's kernels take the bitmask and apply it
        in their read of the logits; code that samples elsewhere (FlashInfer) cannot."""
        return True

    def _masked(self, logits: torch.Tensor, sampling_info: SamplingBatchInfo) -> torch.Tensor:
        """DESIGN §3.0 outside the kernels: the logits with every token sampling_info.token_bitmask
        disallows at -inf (fp32, in this backend's scratch), or the logits as they are."""
        if sampling_info.token_bitmask is None:
            return logits
        return apply_token_bitmask(logits, sampling_info.token_bitmask, self._bitmask_scratch)

    def _checked_logits(self, logits_output: LogitsProcessorOutput,
                        sampling_info: SamplingBatchInfo, rows_per_req: int,
                        columns: tuple[str, int] | None = None) -> torch.Tensor:
        """The step's logits, after every check of the logits and of sampling_info. `columns`
        (name, count): the logits' width when it is not the vocabulary's (a vocabulary shard)."""
        if not isinstance(logits_output, LogitsProcessorOutput):
            raise TypeError(f"logits_output must be a LogitsProcessorOutput, got "
                            f"{type(logits_output).__name__}")
        logits = logits_output.next_token_logits
        if not isinstance(logits, torch.Tensor):
            raise TypeError(f"next_token_logits must be a tensor, got {type(logits).__name__}")
        checks.check_dense(logits, "next_token_logits")
        if logits.device != self.device:
            raise ValueError(f"next_token_logits is on {logits.device}, but this backend's "
                             f"config.device is {self.device}")
        if logits.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise TypeError(f"next_token_logits dtype {logits.dtype} is not float32/float16/bfloat16")
        name, width = columns or ("vocab_size", self.config.vocab_size)
        if logits.dim() != 2 or logits.size(1) != width:
            raise ValueError(f"next_token_logits shape {tuple(logits.shape)} is not "
                             f"[rows, {name}={width}]")
        rows = logits.size(0)
        if rows_per_req > self.config.max_draft_tokens_per_req:
            raise ValueError(f"{rows_per_req} tokens per request exceeds "
                             f"max_draft_tokens_per_req={self.config.max_draft_tokens_per_req}")
        if rows % rows_per_req or rows // rows_per_req > self.config.max_bs:
            raise ValueError(f"next_token_logits has {rows} rows: not a whole number of at most "
                             f"max_bs={self.config.max_bs} requests of {rows_per_req} rows")
        checks.check_batch_info(self.config, self.device, sampling_info, rows // rows_per_req)
        if sampling_info.token_bitmask is not None:
            checks.check_token_bitmask(self.config, self.device, sampling_info.token_bitmask, rows)
        return logits if logits.stride(1) == 1 else logits.contiguous()

    def _checked_verify(self, logits_output: LogitsProcessorOutput, sampling_info: SamplingBatchInfo,
                        candidates, columns: tuple[str, int] | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """verify's (logits, int32 candidates), after every check of its inputs (`columns`: as
        for _checked_logits)."""
        candidates = checks.check_candidates(candidates, self.device,
                                             self.config.max_draft_tokens_per_req)
        bs, n = candidates.shape
        logits = self._checked_logits(logits_output, sampling_info, n, columns)
        if bs * n != logits.size(0):
            raise ValueError(f"candidates shape {(bs, n)} does not match {logits.size(0)} "
                             f"logits rows")
        if sampling_info.draft_probs is not None:
            checks.check_draft_probs(sampling_info.draft_probs, self.device, bs, n,
                                     self.config.vocab_size)
        return logits, candidates

    @property
    def _wants_logprobs(self) -> bool:
        """Whether steps publish logprobs or top-N logprobs (the config asked for either)."""
        return self.config.enable_output_logprobs or self.config.top_logprobs_num > 0

    def _publish_logprobs(self, logits_output: LogitsProcessorOutput, rows: int) -> None:
        views = self._rows(rows)
        if views.logprobs is not None:
            logits_output.next_token_logprobs = views.logprobs
        if views.top_values is not None:
            logits_output.next_token_top_logprobs_val = views.top_values
            logits_output.next_token_top_logprobs_idx = views.top_ids
