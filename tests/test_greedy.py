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
