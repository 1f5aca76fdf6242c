"""FlashInfer adapter backends: the same contract, slot pools and routes as `gumbel` /
`gumbel_full`, with FlashInfer's sampling kernels doing the draw.

Switching an engine to tokensampler's own kernels is then a one-word change
(`create_backend("gumbel_full", cfg)` instead of `create_backend("flashinfer_full", cfg)`).

What these backends give: the same filtered distribution as `gumbel`/`gumbel_full` (the
processed logits are produced by tokensampler's own `penalize_logits` op, so penalties, bias
and NaN handling are identical), per-request parameters from the pools, no host sync, one CUDA
graph per capture variant.

What they do not give: FlashInfer's random numbers are keyed by batch row and a (seed, offset)
pair, not by (seed, position, token id). We pass each request's seed and position as that pair,
but the draw still depends on the row the request occupies and on FlashInfer's rejection rounds,
so there is no batch invariance, plain decode and verify give different (equally distributed)
tokens, and a request's seed reproduces its tokens only in an identical batch layout. Nor do
they give `logprobs_mode="processed"` (refused at construction): their kept set comes from
FlashInfer's renorm kernels, whose top-k / top-p boundaries at ties and near the cut are not
tokensampler's, so a processed logprob would not be exact.
"""

from __future__ import annotations

import torch

from .. import _C
from ..batch import LogitsProcessorOutput, SamplingBatchInfo
from .gumbel import GumbelSamplingBackend
from .gumbel_full import GumbelFullSamplingBackend

__all__ = ["FlashInferSamplingBackend", "FlashInferFullSamplingBackend", "flashinfer_unavailable_reason",
           "flashinfer_config_refusal", "end_chains_at_invalid_rows"]

_ROUTES_WITH_MIN_P = (_C.Route.MIN_P, _C.Route.TOP_K_TOP_P_MIN_P, _C.Route.GENERIC)


def flashinfer_unavailable_reason(device: torch.device) -> str | None:
    """Why the FlashInfer backends cannot run on `device`, or None if they can."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return (f"the flashinfer backends run on CUDA only; config.device is {device}"
                + ("" if torch.cuda.is_available() else " and no CUDA device is available"))
    try:
        import flashinfer.sampling  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure means "not available"
        return (f"flashinfer is not importable ({exc.__class__.__name__}: {exc}); "
                f"install it with `pip install tokensampler[flashinfer]` (flashinfer-python)")
    return None


def flashinfer_config_refusal(config) -> str | None:
    """Why the FlashInfer backends refuse `config` on any machine, or None."""
    if config.logprobs_mode == "processed" and config.enable_output_logprobs:
        return ("logprobs_mode='processed' is not available from the flashinfer backends: the "
                "distribution they sample is filtered by FlashInfer's renorm kernels, whose kept "
                "set can differ from tokensampler's at ties and at the top-p / min-p cut, so the "
                "processed logprob of the sampled token would not be exact (and returning raw "
                "logprobs instead would silently give the other mode). Use the 'gumbel' or "
                "'gumbel_full' backend (same parameters, exact processed logprobs) or "
                "logprobs_mode='raw'")
    return None


def end_chains_at_invalid_rows(predict: torch.Tensor, accept: torch.Tensor,
                               invalid: torch.Tensor) -> None:
    """DESIGN §4 on a rejection-sampled chain whose kernel knows no invalid rows (FlashInfer's):
    a request's first emitted row that is invalid (§3.1) emits token 0 and ends its chain.
    In place, graph-safe: predict int32 [bs * n] (-1 past the chain), accept int32 [bs],
    invalid bool [bs * n] (cleared past the chain, as tokensampler's own verify leaves it)."""
    bs = accept.numel()
    n = predict.numel() // bs
    p, inv = predict.view(bs, n), invalid.view(bs, n)
    pos = torch.arange(n, dtype=torch.int32, device=predict.device)
    first = torch.where(inv, pos, n).amin(1, keepdim=True)  # n: no invalid row
    accept.copy_(torch.minimum(accept, first.squeeze(1) + 1))
    past = pos >= accept.unsqueeze(1)
    p.copy_(torch.where(past, -1, torch.where(pos == first, 0, p)))
    inv.masked_fill_(past, False)


class _FlashInferMixin:
    """Replaces the Gumbel kernels of a Gumbel backend with FlashInfer's draws."""

    _FULL: bool
    _KERNEL_WORKSPACE = False  # FlashInfer draws; tokensampler's sample_rows kernels never run

    @staticmethod
    def _require_flashinfer(config) -> None:
        reason = (flashinfer_config_refusal(config.validate())
                  or flashinfer_unavailable_reason(config.torch_device))
        if reason is not None:
            raise ValueError(reason)

    def _planned_bytes(self, config) -> dict[str, int]:
        planned = super()._planned_bytes(config)
        rows = config.max_bs * config.max_draft_tokens_per_req
        # _processed (fp32 [rows, V]) and _argmax (int32 [rows])
        planned["the processed logits (max_bs * max_draft_tokens_per_req, vocab_size)"] = (
            4 * rows * (config.vocab_size + 1))
        return planned

    def _init_flashinfer(self) -> None:
        import flashinfer.sampling as fs

        self._fs = fs
        cfg = self.config
        rows = cfg.max_bs * cfg.max_draft_tokens_per_req
        self._processed = torch.empty((rows, cfg.vocab_size), dtype=torch.float32, device=self.device)
        self._argmax = torch.empty(rows, dtype=torch.int32, device=self.device)
        self._emitted = torch.zeros(cfg.max_bs, dtype=torch.int32, device=self.device)
        self._accepted = torch.zeros(cfg.max_bs, dtype=torch.int32, device=self.device)

    def _top_k_top_p_probs(self, z, top_k, top_p):
        """softmax, then top-k and top-p renormalisation, per row."""
        return self._fs.top_p_renorm_probs(
            self._fs.top_k_renorm_probs(torch.softmax(z, -1), top_k), top_p)

    def _filtered_probs(self, z, top_k, top_p, min_p):
        """The kept distribution per row: softmax, top-k, top-p, min-p renormalisation."""
        probs = self._top_k_top_p_probs(z, top_k, top_p)
        if self._FULL:
            keep = probs >= min_p.unsqueeze(1) * probs.amax(-1, keepdim=True)
            probs = probs * keep
            probs = probs / probs.sum(-1, keepdim=True)
        return probs

    def _reads_masked_logits(self) -> bool:
        return True  # FlashInfer samples the logits tokensampler's kernels leave

    def _draw(self, logits, sampling_info, n, candidates, out):
        rows = logits.size(0)
        processed = self._processed[:rows]
        torch.ops.tokensampler.penalize_logits(
            logits, sampling_info.req_pool_indices, self.slots.table, self.slots.history_capacity,
            self.slots.bias_capacity, n, candidates if self._FULL else None, 0, processed)
        p = self.row_params(sampling_info, n, rows // n)
        temperature, top_k, top_p, min_p, greedy, seed, offset, readable = p
        z = processed / temperature.unsqueeze(1)
        fs = self._fs
        if self._route == _C.Route.NO_FILTER:
            sampled = fs.sampling_from_logits(z, seed=seed, offset=offset)
        elif self._FULL and self._route in _ROUTES_WITH_MIN_P:
            sampled = fs.min_p_sampling_from_probs(self._top_k_top_p_probs(z, top_k, top_p),
                                                   min_p, seed=seed, offset=offset)
        else:
            sampled = fs.top_k_top_p_sampling_from_logits(z, top_k, top_p, seed=seed, offset=offset)
        argmax, invalid = self._argmax[:rows], self._rows(rows).invalid
        torch.ops.tokensampler.argmax_rows(processed, argmax, None, invalid)
        invalid |= ~readable  # a slot outside the pool: token 0, flagged (DESIGN §5)
        # A row with a +inf z (a +inf logit, or a finite one past fp32's range over T) has NaN
        # probabilities after FlashInfer's softmax, and its draw is whatever the kernel leaves
        # (it differed between identical calls on an H200, run 55): such a row takes its
        # argmax, whose z is +inf, as it would with one +inf entry.
        pos_inf = z.gather(1, argmax.long().unsqueeze(1)).squeeze(1) == float("inf")
        token = torch.where(greedy | pos_inf, argmax, sampled.to(torch.int32))
        out.copy_(token.masked_fill(invalid, 0))
        return z, pos_inf, p

    def _sample_rows(self, logits, sampling_info, n, candidates, out) -> None:
        logits = self._masked(logits, sampling_info)
        self._draw(logits, sampling_info, n, candidates, out)
        if self._wants_logprobs:
            self._emitted_logprobs(logits, sampling_info, None, out, n)  # logits: masked above

    def verify(self, logits_output: LogitsProcessorOutput, sampling_info: SamplingBatchInfo,
               candidates: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if sampling_info.draft_probs is None:
            return super().verify(logits_output, sampling_info, candidates)
        logits, candidates = self._checked_verify(logits_output, sampling_info, candidates)
        logits = self._masked(logits, sampling_info)
        rows, (bs, n) = logits.size(0), candidates.shape
        target = self._rows(rows).target
        z, pos_inf, (_, top_k, top_p, min_p, greedy, seed, offset, _) = self._draw(
            logits, sampling_info, n, candidates, target)
        probs = self._filtered_probs(z, top_k, top_p, min_p)
        # Greedy rows put all mass on their argmax; invalid rows (no finite logit) on token 0,
        # and rows with a +inf z (NaN probs after FlashInfer's softmax) on their argmax, as
        # `sample` gives them: their target. So FlashInfer reads a distribution on every row (a
        # NaN row made chain_speculative_sampling emit arbitrary ids, run 53); any other NaN row
        # too, should one get through.
        one_hot = torch.zeros_like(probs).scatter_(1, target.long().unsqueeze(1), 1.0)
        invalid = self._rows(rows).invalid
        no_distribution = greedy | invalid | pos_inf | probs.isnan().any(1)
        probs = torch.where(no_distribution.unsqueeze(1), one_hot, probs)
        accepted, emitted = self._accepted[:bs], self._emitted[:bs]
        accepted.zero_()
        emitted.zero_()
        # Returns (tokens, accepted, emitted); the counts land in our buffers in place.
        # DESIGN §4's input policy, as far as FlashInfer's kernel allows: q NaN -> 0, clamped to
        # [0, 1]; draft ids outside [0, V) are clamped into it (FlashInfer would read through
        # them) instead of being rejected outright as tokensampler's own kernels do.
        draft_probs = sampling_info.draft_probs.float().nan_to_num(0.0, 1.0, 0.0).clamp_(0.0, 1.0)
        drafts = candidates[:, 1:].clamp(0, self.config.vocab_size - 1).contiguous()
        tokens, _, _ = self._fs.chain_speculative_sampling(
            draft_probs, drafts, probs.view(bs, n, -1),
            accepted, emitted, seed=seed.view(bs, n)[:, 0].contiguous(),
            offset=offset.view(bs, n)[:, 0].contiguous())
        predict, accept = self._verify_outputs(rows, bs)
        predict.copy_(tokens.view(-1).to(torch.int32))
        torch.add(emitted, 1, out=accept)
        end_chains_at_invalid_rows(predict, accept, invalid)
        self._record_history(sampling_info, predict, accept, n)
        if self._wants_logprobs:
            self._emitted_logprobs(logits, sampling_info, None, predict, n)  # logits: masked above
        self._publish_logprobs(logits_output, rows)
        return predict, accept


class FlashInferSamplingBackend(_FlashInferMixin, GumbelSamplingBackend):
    """`gumbel`'s contract (temperature, top-k, top-p, seed) with FlashInfer's draws."""

    _NAME = "flashinfer"

    def __init__(self, config) -> None:
        self._require_flashinfer(config)
        super().__init__(config)
        self._init_flashinfer()


class FlashInferFullSamplingBackend(_FlashInferMixin, GumbelFullSamplingBackend):
    """`gumbel_full`'s contract (adds min-p, penalties, bias) with FlashInfer's draws."""

    _NAME = "flashinfer_full"

    def __init__(self, config) -> None:
        self._require_flashinfer(config)
        super().__init__(config)
        self._init_flashinfer()
