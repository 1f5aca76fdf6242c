import math

import pytest
import torch

import tokensampler as ts
from tokensampler.logprobs import raw_logprobs_at

from helpers import VOCAB, batch_info, make_config


def test_greedy_sample_is_argmax_with_lowest_index_ties():
    b = ts.create_backend("greedy", make_config())
    logits = torch.randn(4, VOCAB)
    logits[1, 10] = logits[1, 20] = 100.0          # tie -> 10
    logits[2, :] = float("nan")
    logits[2, 33] = 1.0                             # NaN counts as -inf
    logits[3, :] = float("-inf")                    # all -inf -> token 0
    tokens, lengths = b.sample(ts.LogitsProcessorOutput(logits), batch_info([1, 2, 3, 4]))
    assert tokens.tolist() == [int(logits[0].argmax()), 10, 33, 0]
    assert lengths.tolist() == [1, 1, 1, 1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_greedy_dtypes(dtype):
    b = ts.create_backend("greedy", make_config())
    logits = torch.randn(3, VOCAB).to(dtype)
    tokens, _ = b.sample(ts.LogitsProcessorOutput(logits), batch_info([1, 2, 3]))
    assert tokens.tolist() == logits.float().argmax(-1).tolist()


def test_greedy_verify_accepts_matching_prefix():
    b = ts.create_backend("greedy", make_config())
    n = 4
    logits = torch.full((2 * n, VOCAB), -5.0)
    argmaxes = [[11, 12, 13, 14], [21, 22, 23, 24]]
    for r in range(2):
        for j in range(n):
            logits[r * n + j, argmaxes[r][j]] = 5.0
    # request 0: all three drafts match; request 1: second draft mismatches
    candidates = torch.tensor([[1, 11, 12, 13], [2, 21, 99, 23]], dtype=torch.int32)
    predict, accept = b.verify(ts.LogitsProcessorOutput(logits), batch_info([1, 2]), candidates)
    assert accept.tolist() == [4, 2]
    assert predict[:4].tolist() == [11, 12, 13, 14]
    assert predict[4:6].tolist() == [21, 22]


def test_greedy_verify_publishes_each_rows_logprobs():
    """Verify publishes logprobs as sample does: each row's own argmax (raw, or 0.0 in processed
    mode) and its top-N."""
    n = 3
    logits = torch.randn(2 * n, VOCAB, generator=torch.Generator().manual_seed(4))
    candidates = torch.tensor([[1, 2, 3], [4, 5, 6]], dtype=torch.int32)
    for mode in ("raw", "processed"):
        b = ts.create_backend("greedy", make_config(enable_output_logprobs=True, logprobs_mode=mode,
                                                    top_logprobs_num=2))
        out = ts.LogitsProcessorOutput(logits)
        b.verify(out, batch_info([1, 2]), candidates)
        ref = torch.log_softmax(logits, -1)
        want = ref.max(-1).values if mode == "raw" else torch.zeros(2 * n)
        torch.testing.assert_close(out.next_token_logprobs, want, atol=1e-5, rtol=0)
        assert out.next_token_top_logprobs_idx[:, 0].tolist() == logits.argmax(-1).tolist()


def test_greedy_logprobs_raw_and_processed():
    logits = torch.randn(2, VOCAB)
    for mode, expect in (("raw", None), ("processed", 0.0)):
        b = ts.create_backend("greedy", make_config(enable_output_logprobs=True, logprobs_mode=mode,
                                                    top_logprobs_num=3))
        out = ts.LogitsProcessorOutput(logits)
        tokens, _ = b.sample(out, batch_info([1, 2]))
        ref = torch.log_softmax(logits, -1)
        want = ref.gather(1, tokens.long().unsqueeze(1)).squeeze(1) if expect is None else torch.zeros(2)
        torch.testing.assert_close(out.next_token_logprobs, want, atol=1e-5, rtol=0)
        assert torch.equal(out.next_token_top_logprobs_idx, ref.topk(3, -1).indices)


def test_greedy_logprobs_equal_the_kernels_on_inf_rows_and_ties():
    """DESIGN §3.8 on every backend: greedy's raw logprobs and top-N (the sampling kernels, on a
    greedy slot) are the gumbel backend's, bit for bit (the CPU kernels), and logprobs.py's torch
    ops give the same, by the rule: a row with no finite logit is -inf (top-N at ids 0..N-1), a
    row with +inf entries gives each -log(count), ties list the lower id first (-0 == +0), NaN
    is -inf; in processed mode an invalid row is -inf and the others 0."""
    inf, nan = float("inf"), float("nan")
    logits = torch.randn(5, VOCAB)
    logits[0, [700, 5, 9]] = 30.0                   # a three-way tie at the top
    logits[1] = -inf
    logits[1, 3] = nan
    logits[2, [41, 40]] = inf
    logits[3] = 0.0
    logits[3, [2, 6]] = -0.0
    logits[4, :600] = nan

    def after(row, first):  # the id of the largest finite raw value outside `first`
        rest = logits[row].nan_to_num(-inf)
        rest[first] = -inf
        return int(rest.argmax())

    cfg = dict(max_bs=5, enable_output_logprobs=True, top_logprobs_num=4)
    greedy = ts.create_backend("greedy", make_config(**cfg))
    kernels = ts.create_backend("gumbel", make_config(**cfg))
    og, ok = ts.LogitsProcessorOutput(logits.clone()), ts.LogitsProcessorOutput(logits.clone())
    tokens, _ = greedy.sample(og, batch_info([1, 2, 3, 4, 5]))
    kernels.sample(ok, batch_info([1, 2, 3, 4, 5]))
    assert tokens.tolist()[:4] == [5, 0, 40, 0]
    assert torch.equal(og.next_token_top_logprobs_idx, ok.next_token_top_logprobs_idx)
    idx = og.next_token_top_logprobs_idx
    assert idx[0].tolist() == [5, 9, 700, after(0, [5, 9, 700])]
    assert idx[1].tolist() == [0, 1, 2, 3]
    assert idx[2].tolist()[:3] == [40, 41, after(2, [40, 41])]
    assert idx[3].tolist() == [0, 1, 2, 3]
    assert torch.equal(og.next_token_top_logprobs_val, ok.next_token_top_logprobs_val)
    # the token is each row's first in rank order, so its logprob is the first top-N value
    assert torch.equal(og.next_token_logprobs, ok.next_token_top_logprobs_val[:, 0])
    assert og.next_token_logprobs[1] == -inf and og.next_token_top_logprobs_val[1].eq(-inf).all()
    assert og.next_token_logprobs[2].item() == pytest.approx(-math.log(2), abs=1e-7)
    # the raw_logprobs op (rejection verify's logprobs, the FlashInfer adapters') is the kernels'
    # rule on the same rows: on CPU the same functions, so bit for bit
    lp, tv = torch.empty(5), torch.empty(5, 4)
    ti = torch.empty(5, 4, dtype=torch.int64)
    raw_logprobs_at(logits, tokens, lp, tv, ti)
    assert torch.equal(ti, og.next_token_top_logprobs_idx)
    assert torch.equal(tv, og.next_token_top_logprobs_val)
    assert torch.equal(lp, og.next_token_logprobs)
    processed = ts.create_backend("greedy", make_config(logprobs_mode="processed", **cfg))
    op = ts.LogitsProcessorOutput(logits.clone())
    processed.sample(op, batch_info([1, 2, 3, 4, 5]))
    assert op.next_token_logprobs.tolist() == [0.0, -inf, 0.0, 0.0, 0.0]


def test_rows_without_finite_or_inf_logits_are_flagged_invalid():
    """DESIGN §3.1 for the greedy backend too: token 0 and invalid_rows set, in sample and
    verify; rows with a finite or +inf entry are not flagged."""
    b = ts.create_backend("greedy", make_config())
    logits = torch.randn(4, VOCAB)
    logits[1] = float("-inf")
    logits[2] = float("nan")
    logits[3] = float("-inf")
    logits[3, 7] = float("inf")
    tokens, _ = b.sample(ts.LogitsProcessorOutput(logits), batch_info([1, 2, 3, 4]))
    assert tokens.tolist()[1:] == [0, 0, 7]
    assert b.invalid_rows[:4].tolist() == [False, True, True, False]
    candidates = torch.zeros(2, 2, dtype=torch.int32)
    b.verify(ts.LogitsProcessorOutput(logits), batch_info([1, 2]), candidates)
    assert b.invalid_rows[:4].tolist() == [False, True, True, False]


def test_argmax_rows_flags_rows_the_bitmask_empties():
    """argmax_rows' out_invalid: a row is invalid when nothing allowed is finite or +inf
    (DESIGN §3.0–3.1); the flags are written for every row, valid ones included."""
    V = 70
    logits = torch.randn(4, V)
    bits = torch.full((4, 3), -1, dtype=torch.int32)
    bits[0] = 0                                   # nothing allowed
    bits[1] = 0
    bits[1, 2] = 1 << 3                           # token 67 alone allowed
    logits[2, :] = float("-inf")                  # allowed, but all -inf
    logits[3, 5] = float("nan")
    tokens = torch.full((4,), -1, dtype=torch.int32)
    invalid = torch.tensor([False, True, False, True])
    torch.ops.tokensampler.argmax_rows(logits, tokens, bits, invalid)
    assert invalid.tolist() == [True, False, True, False]
    assert tokens.tolist()[:3] == [0, 67, 0]
    assert tokens[3].item() == logits[3].nan_to_num(float("-inf")).argmax().item()
