import pytest
import torch

import tokensampler as ts

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
