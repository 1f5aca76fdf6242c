"""Gumbel-max backend: temperature, top-k, top-p and per-request seed from slot pools.

Noise is keyed by (seed, position, token id), so a request's tokens do not depend on its batch
row, the batch size, the route, eager vs graph replay, or plain decode vs verify (DESIGN §3.7).
"""

from __future__ import annotations

import operator
from typing import NamedTuple, Sequence

import torch

from .. import _C
from ..batch import LogitsProcessorOutput, SamplingBatchInfo
from ..graphs import (
    CUDA_GRAPH_VARIANT_DEFAULT,
    CUDA_GRAPH_VARIANT_NO_FILTER,
    CUDA_GRAPH_VARIANT_TOP_K,
    CUDA_GRAPH_VARIANT_TOP_K_TOP_P,
    CUDA_GRAPH_VARIANT_TOP_P,
    CUDA_GRAPH_VARIANT_VERIFY_NO_FILTER,
)
from ..logprobs import raw_logprobs_at
from ..params import SamplingParams
from .base import SamplingBackend
from . import checks
from .slot_params import penalty_field, to_slot_params, unsupported_field

__all__ = ["GumbelSamplingBackend"]

_COL = _C.SLOT_COLUMNS


class RowParams(NamedTuple):
    """Per-row sampling parameters gathered from the slot pools (rows = bs * n)."""
    temperature: torch.Tensor  # greedy rows read 1, so l / T stays finite
    top_k: torch.Tensor        # disabled (-1 or >= V) reads V
    top_p: torch.Tensor
    min_p: torch.Tensor
    greedy: torch.Tensor       # temperature 0 or top_k 1
    seed: torch.Tensor         # int64
    position: torch.Tensor     # int64: valid_cache_lengths[slot] + j
    readable: torch.Tensor     # the slot is inside the pool (else the row reads neutral row 0)


class _Admitted(NamedTuple):
    """A request's converted parameters, reused while it brings the same SamplingParams."""
    source: SamplingParams
    params: _C.SlotParams
    max_top_k: int             # its k for step_max_top_k: V without top-k, 1 for greedy


_MAX_TOP_K = operator.attrgetter("max_top_k")

_VARIANT_ROUTES = {
    CUDA_GRAPH_VARIANT_DEFAULT: _C.Route.GENERIC,
    CUDA_GRAPH_VARIANT_NO_FILTER: _C.Route.NO_FILTER,
    CUDA_GRAPH_VARIANT_TOP_P: _C.Route.TOP_P,
    CUDA_GRAPH_VARIANT_TOP_K: _C.Route.TOP_K,
    CUDA_GRAPH_VARIANT_TOP_K_TOP_P: _C.Route.TOP_K_TOP_P,
    CUDA_GRAPH_VARIANT_VERIFY_NO_FILTER: _C.Route.NO_FILTER,
}


class GumbelSamplingBackend(SamplingBackend):
    # What the full backend adds; the plain one refuses min-p, penalties and bias.
    _FULL = False
    _NAME = "gumbel"
    # Whether tokensampler's own sample_rows kernels draw (the FlashInfer adapters say no).
    _KERNEL_WORKSPACE = True

    def __init__(self, config) -> None:
        super().__init__(config)
        config = self.config
        history, bias = self._capacities(config)
        self.slots = _C.SlotStateManager(
            pool_rows=config.pool_rows, vocab_size=config.vocab_size, history_capacity=history,
            bias_capacity=bias, with_min_p=self._FULL, device=str(self.device))
        self._route = _C.Route.GENERIC
        self.step_max_top_k = config.vocab_size
        # rid -> its latest SamplingParams' conversion; slot -> the conversion written there.
        self._converted: dict[str, _Admitted] = {}
        self._in_slot: list[_Admitted | None] = [None] * config.pool_rows
        self._row_offsets = torch.arange(config.max_draft_tokens_per_req, device=self.device)

    def _capacities(self, config) -> tuple[int, int]:
        """The slot table's (history, bias) capacities: `gumbel` keeps neither."""
        if not self._FULL:
            return 0, 0
        return min(config.penalty_history_capacity, config.vocab_size), config.logit_bias_capacity

    def _uses_kernel_workspace(self, config) -> bool:
        return self._KERNEL_WORKSPACE and config.torch_device.type == "cuda"

    def _table_bytes(self, config) -> dict[str, int]:
        return {"the slot table (max_req_pool_size, vocab_size, penalty_history_capacity, "
                "logit_bias_capacity)": _C.SlotStateManager.table_bytes(
                    config.pool_rows, config.vocab_size, *self._capacities(config))}

    def _planned_bytes(self, config) -> dict[str, int]:
        return super()._planned_bytes(config) | self._table_bytes(config)

    def _planned_host_bytes(self, config) -> dict[str, int]:
        return self._table_bytes(config)  # the slot manager builds the table on the host first

    # ---- pool views (one int32 table; floats stored as bits) ----
    def _column(self, col: int, dtype: torch.dtype) -> torch.Tensor:
        return self.slots.table[:, col].view(dtype)

    @property
    def temperature_pool(self) -> torch.Tensor:
        return self._column(_COL["temperature"], torch.float32)

    @property
    def top_k_pool(self) -> torch.Tensor:
        return self._column(_COL["top_k"], torch.int32)

    @property
    def top_p_pool(self) -> torch.Tensor:
        return self._column(_COL["top_p"], torch.float32)

    @property
    def seed_pool(self) -> torch.Tensor:
        """int64 seeds: two int32 words per slot."""
        return self._seeds(self.slots.table)

    @staticmethod
    def _seeds(rows: torch.Tensor) -> torch.Tensor:
        # Arithmetic, not a dtype view: a view of one gathered row keeps an odd storage offset.
        lo = rows[:, _COL["seed_lo"]].to(torch.int64) & 0xFFFFFFFF
        hi = rows[:, _COL["seed_lo"] + 1].to(torch.int64)
        return (hi << 32) | lo

    def row_params(self, sampling_info: SamplingBatchInfo, n: int, bs: int) -> RowParams:
        """The pools' parameters of each of the step's bs * n rows, gathered on the device
        (for samplers outside the kernels: the FlashInfer adapters, vocab-parallel sampling).
        req_pool_indices may be longer than bs (padding) and its entries are the engine's: one
        outside the pool gathers the neutral row 0 and reads `readable` False (DESIGN §5: such
        a row is invalid, token 0), never an index past the pool."""
        slots = sampling_info.req_pool_indices[:bs].long()
        readable = self._readable_slots(slots)
        slots = torch.where(readable, slots, 0)
        positions = sampling_info.valid_cache_lengths.long().index_select(0, slots)
        if n > 1:
            slots = slots.repeat_interleave(n)
            readable = readable.repeat_interleave(n)
            positions = (positions.unsqueeze(1) + self._row_offsets[:n]).reshape(-1)
        rows = self.slots.table[:, :_COL["seed_lo"] + 2].index_select(0, slots)
        temperature = rows[:, _COL["temperature"]].view(torch.float32)
        top_k = rows[:, _COL["top_k"]]
        greedy = (temperature <= 0) | (top_k == 1)
        vocab = self.config.vocab_size
        return RowParams(
            temperature=torch.where(greedy, torch.ones_like(temperature), temperature),
            top_k=torch.where((top_k <= 0) | (top_k >= vocab), torch.full_like(top_k, vocab), top_k),
            top_p=rows[:, _COL["top_p"]].view(torch.float32).contiguous(),
            min_p=rows[:, _COL["min_p"]].view(torch.float32).contiguous(),
            greedy=greedy, seed=self._seeds(rows), position=positions, readable=readable)

    @property
    def route(self) -> str:
        return _C.route_name(self._route)

    # ---- step preparation ----
    def prepare_step(self, request_ids: Sequence[str], request_pool_indices: Sequence[int],
                     sampling_params_list: Sequence[SamplingParams], num_tokens_per_req: int = 1,
                     *, prompt_token_ids: Sequence[Sequence[int] | None] | None = None) -> None:
        step = checks.check_step(self.config, request_ids, request_pool_indices,
                                 sampling_params_list, num_tokens_per_req, prompt_token_ids)
        # A slot holds the parameters its request brought when the slot flipped (DESIGN §2); the
        # route and step_max_top_k come from those same parameters. A request that brings a new
        # SamplingParams object is validated and converted now (steady steps reuse the
        # conversion: ~6 us per request saved) and the new parameters reach a slot at its
        # next flip, a move to another slot included. Prompts are read only for flips.
        rids, slots = step.rids, step.slots
        previous, in_slot = self._converted, self._in_slot
        conversions = [conv if (conv := previous.get(rid)) is not None and conv.source is sp
                       else self._convert(rid, sp) for rid, sp in zip(rids, step.params)]
        flips = list(map(operator.ne, map(self.slots.owner, slots), rids))
        in_effect = [conv if flip else in_slot[slot]
                     for conv, flip, slot in zip(conversions, flips, slots)]
        prompts = ([checks.check_prompt(prompt, i, self.config.vocab_size) if flip else None
                    for i, (prompt, flip) in enumerate(zip(step.prompts, flips))]
                   if step.prompts is not None else [None] * len(rids))
        self._route = self.slots.prepare_step(rids, slots, [a.params for a in in_effect], prompts)
        for slot, conv, flip in zip(slots, conversions, flips):
            if flip:
                in_slot[slot] = conv
        self._converted = dict(zip(rids, conversions))
        # Largest top-k of the step's sampled rows (V when a row has none): host-side, so
        # callers such as vocab-parallel sampling can size candidate sets without a sync.
        self.step_max_top_k = max(map(_MAX_TOP_K, in_effect), default=1)

    def _convert(self, rid, sp: SamplingParams) -> _Admitted:
        vocab = self.config.vocab_size
        p = to_slot_params(sp, rid, vocab)
        if not self._FULL and (field := unsupported_field(sp)) is not None:
            raise ValueError(f"rid={rid!r}: backend {self._NAME!r} does not apply {field}; "
                             f"use {self._NAME + '_full'!r}")
        if self._FULL and self.slots.history_capacity == 0 and (field := penalty_field(sp)):
            # Refused, not ignored: no history (prompt or output) is kept for it to read.
            raise ValueError(f"rid={rid!r}: {field} needs the slot's token history, but this "
                             f"backend was built with penalty_history_capacity=0")
        if sp.logit_bias and len(sp.logit_bias) > self.slots.bias_capacity:
            raise ValueError(f"rid={rid!r}: logit_bias has {len(sp.logit_bias)} entries, more "
                             f"than logit_bias_capacity={self.slots.bias_capacity}")
        sampled = p.temperature > 0 and p.top_k != 1
        return _Admitted(sp, p, (p.top_k if 0 < p.top_k < vocab else vocab) if sampled else 1)

    def _prepare_capture(self, bs: int, num_tokens_per_req: int) -> None:
        # Warm-up runs against pool row 0; the default graph must serve any mix of filters.
        self._route = _C.Route.GENERIC

    def _capture_variants(self, num_tokens_per_req: int) -> tuple[str, ...]:
        variants = (CUDA_GRAPH_VARIANT_DEFAULT, CUDA_GRAPH_VARIANT_NO_FILTER,
                    CUDA_GRAPH_VARIANT_TOP_P, CUDA_GRAPH_VARIANT_TOP_K,
                    CUDA_GRAPH_VARIANT_TOP_K_TOP_P)
        if num_tokens_per_req > 1:
            variants += (CUDA_GRAPH_VARIANT_VERIFY_NO_FILTER,)
        return variants

    def _variant_routes(self) -> dict:
        return _VARIANT_ROUTES

    def _prepare_capture_variant(self, bs: int, num_tokens_per_req: int, variant: str) -> None:
        self._route = self._variant_routes()[variant]
        # A captured top-k graph must serve any k its replays will see: up to the split-row
        # path's largest (steps with a larger k replay the default, generic graph).
        self.step_max_top_k = _C.SPLIT_ROW_MAX_TOP_K

    def _replay_variant(self, num_tokens_per_req: int) -> str:
        if self._route == _C.Route.GENERIC or (
                _C.is_top_k_route(self._route) and self.step_max_top_k > _C.SPLIT_ROW_MAX_TOP_K):
            return CUDA_GRAPH_VARIANT_DEFAULT
        if self._route == _C.Route.NO_FILTER and num_tokens_per_req > 1:
            return CUDA_GRAPH_VARIANT_VERIFY_NO_FILTER
        return _C.route_name(self._route)

    def _reads_masked_logits(self) -> bool:
        return False  # sample_rows and verify_rejection apply token_bitmask in their read

    def reset_capture_state(self) -> None:
        self.slots.reset_slot(0)
        self._in_slot[0] = None

    # ---- the work ----
    def _sample_rows(self, logits: torch.Tensor, sampling_info: SamplingBatchInfo, n: int,
                     candidates: torch.Tensor | None, out: torch.Tensor) -> None:
        views = self._rows(logits.size(0))
        torch.ops.tokensampler.sample_rows(
            logits, sampling_info.req_pool_indices, sampling_info.valid_cache_lengths,
            self.slots.table, self.slots.history_capacity, self.slots.bias_capacity, n,
            candidates, self._FULL, self._logprobs_mode, *self._route_args(), out,
            views.invalid, views.logprobs, views.top_values, views.top_ids, self._workspace,
            sampling_info.token_bitmask)

    def _readable_slots(self, slots: torch.Tensor) -> torch.Tensor:
        """Which of the engine's slot indices lie inside the pool (DESIGN §5)."""
        return (slots >= 0) & (slots < self.config.pool_rows)

    def _readable_rows(self, sampling_info: SamplingBatchInfo, bs: int, n: int) -> torch.Tensor:
        """_readable_slots of the step's bs requests, for each of their n rows."""
        return self._readable_slots(sampling_info.req_pool_indices[:bs]).repeat_interleave(n)

    def _unreadable_logprobs(self, readable: torch.Tensor) -> None:
        """The logprob outputs of rows whose slot is outside the pool, as the kernels write them
        (README: those of a row with no finite logit): -inf at the row's token, and top-N -inf
        at ids 0..N-1. Graph-safe torch ops, for logprobs computed without the ops (the
        vocab-parallel sampler)."""
        rows = readable.numel()
        unreadable = ~readable
        if self._logprobs is not None:
            self._logprobs[:rows].masked_fill_(unreadable, float("-inf"))
        if self._top_values is not None:
            self._top_values[:rows].masked_fill_(unreadable.unsqueeze(1), float("-inf"))
            ids = torch.arange(self._top_ids.size(1), device=self.device).expand(rows, -1)
            self._top_ids[:rows].copy_(torch.where(unreadable.unsqueeze(1), ids, self._top_ids[:rows]))

    def _emitted_logprobs(self, logits: torch.Tensor, sampling_info: SamplingBatchInfo,
                          token_bitmask: torch.Tensor | None, tokens: torch.Tensor, n: int) -> None:
        """DESIGN §3.8 for the paths whose kernels emit tokens only (rejection-sampling verify,
        the FlashInfer adapters): each row's raw logprob at its token, NaN for rows past a
        request's accepted tokens (token -1: they hold none), and every row's top-N, under the
        grammar bitmask; rows whose slot is outside the pool as the kernels write them (all in
        the raw_logprobs op)."""
        raw_logprobs_at(logits, tokens, self._logprobs, self._top_values, self._top_ids,
                        token_bitmask, sampling_info.req_pool_indices, n, self.config.pool_rows)

    def _route_args(self) -> tuple[int, int]:
        """The ops' (route, max_top_k): the step's route, and for top-k routes its largest k
        (0, "unknown", otherwise). They pick a CUDA kernel; computed from the step's own
        parameters, they never change tokens."""
        max_top_k = (min(self.step_max_top_k, self.config.vocab_size)
                     if _C.is_top_k_route(self._route) else 0)
        return int(self._route), max_top_k

    def _record_history(self, sampling_info, tokens, lengths, n) -> None:
        if self._FULL and self.slots.history_capacity > 0:
            torch.ops.tokensampler.append_history(
                self.slots.table, self.slots.history_capacity, self.slots.bias_capacity,
                sampling_info.req_pool_indices, tokens, lengths, n)

    def sample(self, logits_output: LogitsProcessorOutput, sampling_info: SamplingBatchInfo
               ) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self._checked_logits(logits_output, sampling_info, 1)
        bs = logits.size(0)
        tokens, lengths = self._sample_outputs(bs)
        self._sample_rows(logits, sampling_info, 1, None, tokens)
        self._record_history(sampling_info, tokens, lengths, 1)
        self._publish_logprobs(logits_output, bs)
        return tokens, lengths

    def verify(self, logits_output: LogitsProcessorOutput, sampling_info: SamplingBatchInfo,
               candidates: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits, candidates = self._checked_verify(logits_output, sampling_info, candidates)
        rows, (bs, n) = logits.size(0), candidates.shape
        predict, accept = self._verify_outputs(rows, bs)
        if sampling_info.draft_probs is not None:
            if self._wants_logprobs and self.config.logprobs_mode == "processed":
                raise ValueError(
                    "draft_probs: rejection-sampling verify gives raw logprobs only, and this "
                    "backend was built with logprobs_mode='processed' (verify without "
                    "draft_probs, or use logprobs_mode='raw')")
            torch.ops.tokensampler.verify_rejection(
                logits, sampling_info.req_pool_indices, sampling_info.valid_cache_lengths,
                self.slots.table, self.slots.history_capacity, self.slots.bias_capacity,
                candidates, sampling_info.draft_probs, self._FULL, *self._route_args(),
                predict, accept, self._rows(rows).invalid, sampling_info.token_bitmask,
                self._workspace)
            if self._wants_logprobs:
                self._emitted_logprobs(logits, sampling_info, sampling_info.token_bitmask,
                                       predict, n)
        else:
            target = self._rows(rows).target
            self._sample_rows(logits, sampling_info, n, candidates, target)
            torch.ops.tokensampler.verify_chain(candidates, target, predict, accept,
                                                self._rows(rows).invalid)
        self._record_history(sampling_info, predict, accept, n)
        self._publish_logprobs(logits_output, rows)
        return predict, accept
