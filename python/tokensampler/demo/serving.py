"""A small continuous-batching engine around a Hugging Face causal LM and a tokensampler backend.

Every request owns a pool slot of the sampling backend while it runs. Each step the engine
  1. admits queued requests into free slots (prefill of prompt[:-1] into the KV cache; the
     request's last token is "pending": the next forward's input), passing their prompt tokens
     to `prepare_step` so the slot flip seeds the repetition-penalty history;
  2. runs ONE batched forward over all active requests: the pending token (plain decoding) or
     the pending token plus prompt-lookup drafts (speculative), with a left-padded KV cache, an
     explicit attention mask and explicit position ids;
  3. samples (`sample`) or verifies (`verify`) the batch with the backend, appends the new tokens,
     drops the KV columns of rejected drafts, and retires requests at EOS or their length limit,
     freeing their slots for the queue.

Sampling position t of a request = tokens already in its sequence (prompt + output), handed to
the backend as `valid_cache_lengths[slot]`; with the backend's position-keyed noise this makes
speculative decoding reproduce plain decoding token for token.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

import tokensampler as ts

from .model import forward_cache_kwarg
from .speculative import prompt_lookup_drafts

__all__ = ["Request", "Engine", "EngineStats"]


@dataclass
class Request:
    rid: str
    prompt_ids: list[int]
    params: ts.SamplingParams
    max_new_tokens: int = 48
    label: str = ""
    # An xgrammar compiled grammar the output must follow (demo/grammar.py); needs an engine
    # built with enable_token_bitmask.
    grammar: object | None = None
    # Filled by the engine.
    matcher: object | None = None
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    slot: int = 0
    drafted: int = 0      # real (prompt-lookup) draft tokens proposed
    accepted: int = 0     # of those, accepted
    steps: int = 0

    @property
    def sequence(self) -> list[int]:
        return self.prompt_ids + self.output_ids


@dataclass
class EngineStats:
    steps: int = 0
    prefills: int = 0
    prefill_s: float = 0.0
    forward_s: float = 0.0
    sampler_s: float = 0.0
    tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    wall_s: float = 0.0
    slot_flips: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


class _BatchKV:
    """Per-layer K/V of the active requests, [B, heads, L, head_dim], left-padded; `mask[b, c]`
    says whether column c holds one of request b's tokens (padding and rejected drafts don't)."""

    def __init__(self) -> None:
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.mask: torch.Tensor | None = None

    @property
    def width(self) -> int:
        return 0 if self.mask is None else self.mask.size(1)

    @property
    def rows(self) -> int:
        return 0 if self.mask is None else self.mask.size(0)

    @staticmethod
    def _pad_left(t: torch.Tensor, width: int) -> torch.Tensor:
        extra = width - t.size(2)
        if extra == 0:
            return t
        pad = t.new_zeros(t.size(0), t.size(1), extra, t.size(3))
        return torch.cat([pad, t], dim=2)

    def append_rows(self, keys, values, mask: torch.Tensor) -> None:
        """Adds requests (their own K/V and mask) below the current rows."""
        if self.mask is None:
            self.keys, self.values, self.mask = list(keys), list(values), mask
            return
        width = max(self.width, mask.size(1))
        pad = lambda m: torch.cat([m.new_zeros(m.size(0), width - m.size(1)), m], dim=1)  # noqa: E731
        self.mask = torch.cat([pad(self.mask), pad(mask)], dim=0)
        self.keys = [torch.cat([self._pad_left(a, width), self._pad_left(b, width)], dim=0)
                     for a, b in zip(self.keys, keys)]
        self.values = [torch.cat([self._pad_left(a, width), self._pad_left(b, width)], dim=0)
                       for a, b in zip(self.values, values)]

    def keep_rows(self, rows: list[int]) -> None:
        if not rows:
            self.keys, self.values, self.mask = [], [], None
            return
        if rows == list(range(self.rows)):
            return
        idx = torch.tensor(rows, device=self.mask.device)
        self.mask = self.mask.index_select(0, idx)
        self.keys = [k.index_select(0, idx) for k in self.keys]
        self.values = [v.index_select(0, idx) for v in self.values]
        self.compact()

    def compact(self) -> None:
        """Right-aligns each row's live columns and drops columns no row uses."""
        if self.mask is None:
            return
        B, L = self.mask.shape
        W = int(self.mask.sum(1).max())
        if W == L:
            return
        # A stable sort on the 0/1 mask moves dead columns left, live ones right, in order.
        order = torch.sort(self.mask.to(torch.int8), dim=1, stable=True).indices[:, L - W:]
        self.mask = torch.gather(self.mask, 1, order)
        h, d = self.keys[0].size(1), self.keys[0].size(3)
        idx = order[:, None, :, None].expand(B, h, W, d)
        self.keys = [k.gather(2, idx) for k in self.keys]
        self.values = [v.gather(2, idx) for v in self.values]


class Engine:
    """Continuous batching over `model` with sampling backend `backend_name` (see module doc).

    speculative: verify up to `num_draft` prompt-lookup drafts per request and step.
    logprobs_mode: None (no logprobs) or "raw"/"processed"; sampled-token logprobs then land in
    `Request.output_logprobs`.
    enable_token_bitmask: every step passes a persistent grammar bitmask (one row per logits row,
    all ones for requests without a grammar) as `SamplingBatchInfo.token_bitmask`.
    """

    def __init__(self, model, eos_token_id: int | Sequence[int] | None, *, max_batch: int = 4,
                 backend_name: str = "gumbel_full", speculative: bool = False, num_draft: int = 4,
                 logprobs_mode: str | None = None, device: str | torch.device = "cpu",
                 enable_token_bitmask: bool = False) -> None:
        self.model = model
        self.device = torch.device(device)
        eos = [] if eos_token_id is None else (
            [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id))
        self.eos = set(int(e) for e in eos)
        self.max_batch = max_batch
        self.speculative = speculative
        self.num_draft = num_draft if speculative else 0
        self.vocab_size = int(model.get_output_embeddings().weight.size(0))
        self.config = ts.SamplingBackendConfig(
            max_bs=max_batch, max_draft_tokens_per_req=1 + self.num_draft,
            max_req_pool_size=max_batch, vocab_size=self.vocab_size, device=str(self.device),
            enable_output_logprobs=logprobs_mode is not None,
            logprobs_mode=logprobs_mode or "raw", enable_token_bitmask=enable_token_bitmask)
        self.backend = ts.create_backend(backend_name, self.config)
        self._masks = None
        if enable_token_bitmask:
            from .grammar import StepMasks
            self._masks = StepMasks(max_batch * (1 + self.num_draft), self.vocab_size, self.device)
        self._cache_kw = forward_cache_kwarg(model)
        self._valid_lengths = torch.zeros(max_batch + 1, dtype=torch.int32, device=self.device)
        self.stats = EngineStats()

    # ---- model ----
    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                 kv: _BatchKV | None) -> tuple[torch.Tensor, list, list]:
        """Logits [B, q, V] (fp32) and the new per-layer K/V, [B, h, L + q, d]."""
        from transformers import DynamicCache
        B, q = input_ids.shape
        L = 0 if kv is None else kv.width
        dtype = self.model.dtype
        if kv is None:
            cache, mask4d = DynamicCache(), None  # a single unpadded sequence: plain causal
        else:
            cache = DynamicCache(ddp_cache_data=list(zip(kv.keys, kv.values)))
            live = torch.cat([kv.mask, kv.mask.new_ones(B, q)], dim=1)          # [B, L + q]
            cols = torch.arange(L + q, device=self.device)
            causal = cols[None, :] <= (L + torch.arange(q, device=self.device))[:, None]
            allowed = live[:, None, None, :] & causal[None, None]               # [B, 1, q, L + q]
            mask4d = torch.zeros(allowed.shape, dtype=dtype, device=self.device)
            mask4d.masked_fill_(~allowed, torch.finfo(dtype).min)
        with torch.inference_mode():
            out = self.model(input_ids=input_ids, attention_mask=mask4d, position_ids=positions,
                             use_cache=True, **{self._cache_kw: cache})
        new_cache = getattr(out, "cache", None)
        if new_cache is None:
            new_cache = out.past_key_values
        keys = [layer.keys for layer in new_cache.layers]
        values = [layer.values for layer in new_cache.layers]
        return out.logits.float(), keys, values

    def _prefill(self, req: Request, kv: _BatchKV) -> None:
        ctx = req.prompt_ids[:-1]
        ids = torch.tensor([ctx], dtype=torch.long, device=self.device)
        pos = torch.arange(len(ctx), device=self.device)[None]
        self._sync()
        t0 = time.perf_counter()
        _, keys, values = self._forward(ids, pos, None)
        self._sync()
        self.stats.prefill_s += time.perf_counter() - t0
        self.stats.prefills += 1
        kv.append_rows(keys, values, torch.ones(1, len(ctx), dtype=torch.bool, device=self.device))

    # ---- the loop ----
    def run(self, requests: Sequence[Request],
            on_tokens: Callable[[int], None] | None = None) -> list[Request]:
        """Serves `requests` (at most max_batch at a time, in order of arrival) to completion and
        returns them. on_tokens(n) is called after each step with the tokens it produced."""
        t_start = time.perf_counter()
        queue = list(requests)
        for r in queue:
            if len(r.prompt_ids) < 2:
                raise ValueError(f"request {r.rid}: the prompt needs at least 2 tokens")
            r.output_ids, r.output_logprobs, r.finish_reason = [], [], None
            r.matcher = None
            if r.grammar is not None:
                if self._masks is None:
                    raise ValueError(f"request {r.rid} has a grammar: build the Engine with "
                                     f"enable_token_bitmask=True")
                from .grammar import new_matcher
                r.matcher = new_matcher(r.grammar)
        free = list(range(self.max_batch, 0, -1))   # pool slots 1..max_batch (0 is neutral)
        active: list[Request] = []
        kv = _BatchKV()
        while queue or active:
            fresh: set[str] = set()
            while queue and free:
                req = queue.pop(0)
                req.slot = free.pop()
                self._prefill(req, kv)
                active.append(req)
                fresh.add(req.rid)
            produced = self._step(active, kv, fresh)
            done = [i for i, r in enumerate(active) if r.finish_reason is not None]
            if done:
                for i in done:
                    free.append(active[i].slot)
                keep = [i for i, r in enumerate(active) if r.finish_reason is None]
                active = [active[i] for i in keep]
                kv.keep_rows(keep)
            if on_tokens is not None:
                on_tokens(produced)
        self.stats.wall_s += time.perf_counter() - t_start
        return list(requests)

    def _step(self, active: list[Request], kv: _BatchKV, fresh: set[str]) -> int:
        B = len(active)
        drafts: list[list[int]] = []
        for r in active:
            budget = min(self.num_draft, r.max_new_tokens - len(r.output_ids) - 1)
            drafts.append(prompt_lookup_drafts(r.sequence, budget) if budget > 0 else [])
        n = 1 + max(len(d) for d in drafts)
        rows = []
        for r, d in zip(active, drafts):
            pending = r.sequence[-1]
            # Requests with fewer drafts are padded with their pending token: a padded draft is
            # verified like any other and is accepted only when it IS the target's sample.
            rows.append([pending] + d + [pending] * (n - 1 - len(d)))
        cand = torch.tensor(rows, dtype=torch.long, device=self.device)
        start = torch.tensor([len(r.sequence) - 1 for r in active], device=self.device)
        positions = start[:, None] + torch.arange(n, device=self.device)[None]

        self._sync()
        t0 = time.perf_counter()
        logits, keys, values = self._forward(cand, positions, kv)
        logits = logits.reshape(B * n, -1).contiguous()
        self._sync()
        t1 = time.perf_counter()

        # --- sampler ---
        be = self.backend
        be.prepare_step([r.rid for r in active], [r.slot for r in active],
                        [r.params for r in active], num_tokens_per_req=n,
                        prompt_token_ids=[r.prompt_ids if r.rid in fresh else None for r in active])
        slots = torch.tensor([r.slot for r in active], dtype=torch.int32)
        lengths = torch.tensor([len(r.sequence) for r in active], dtype=torch.int32)
        self._valid_lengths.zero_()
        self._valid_lengths[slots.long().to(self.device)] = lengths.to(self.device)
        bitmask = (None if self._masks is None
                   else self._masks.fill([r.matcher for r in active], rows))
        info = ts.SamplingBatchInfo(req_pool_indices=slots.to(self.device),
                                    valid_cache_lengths=self._valid_lengths,
                                    vocab_size=self.vocab_size, device=self.device,
                                    token_bitmask=bitmask)
        lpo = ts.LogitsProcessorOutput(logits)
        if n == 1:
            tokens, accept = be.sample(lpo, info)
        else:
            tokens, accept = be.verify(lpo, info, cand.to(torch.int32))
        tokens, accept = tokens.tolist(), accept.tolist()   # copies: the views get overwritten
        logprobs = lpo.next_token_logprobs.tolist() if lpo.next_token_logprobs is not None else None
        self._sync()
        t2 = time.perf_counter()
        self.stats.forward_s += t1 - t0
        self.stats.sampler_s += t2 - t1
        self.stats.steps += 1
        self.stats.slot_flips += len(fresh)

        # --- bookkeeping ---
        produced = 0
        live = torch.ones(B, n, dtype=torch.bool, device=self.device)
        for b, r in enumerate(active):
            a = accept[b]
            real = len(drafts[b])
            r.drafted += real
            r.accepted += min(a - 1, real)
            self.stats.drafted += real
            self.stats.accepted += min(a - 1, real)
            r.steps += 1
            # KV keeps the pending token and the accepted drafts (columns 0..a-1).
            live[b, a:] = False
            for j in range(a):
                tok = tokens[b * n + j]
                r.output_ids.append(tok)
                if r.matcher is not None and not r.matcher.accept_token(tok):
                    raise RuntimeError(f"request {r.rid}: token {tok} breaks its grammar")
                if logprobs is not None:
                    r.output_logprobs.append(logprobs[b * n + j])
                produced += 1
                if tok in self.eos:
                    r.finish_reason = "eos"
                    break
                if len(r.output_ids) >= r.max_new_tokens:
                    r.finish_reason = "length"
                    break
        self.stats.tokens += produced
        kv.keys, kv.values = keys, values
        kv.mask = torch.cat([kv.mask, live], dim=1)
        if n > 1:
            kv.compact()
        return produced
