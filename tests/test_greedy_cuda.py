"""The greedy backend's CUDA kernel: argmax equals torch.argmax, ties to the lowest index."""

import pytest
import torch

import tokensampler as ts

pytestmark = pytest.mark.cuda


def backend(V, bs=8):
    return ts.create_backend("greedy", ts.SamplingBackendConfig(
        max_bs=bs, max_draft_tokens_per_req=4, max_req_pool_size=bs, vocab_size=V, device="cuda"))


def info(bs, V, pool=8):
    """Slots 1..bs of a backend whose pool has `pool` slots (valid_cache_lengths: pool + 1)."""
    return ts.SamplingBatchInfo(torch.arange(1, bs + 1, dtype=torch.int32, device="cuda"),
                                torch.zeros(pool + 1, dtype=torch.int32, device="cuda"), V, "cuda")


@pytest.mark.parametrize("V", [1, 7, 1000, 50257, 151936])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_argmax_matches_torch_and_cpu(V, dtype):
    logits = torch.randn(8, V, device="cuda").to(dtype)
    tokens, lengths = backend(V).sample(ts.LogitsProcessorOutput(logits), info(8, V))
    assert tokens.tolist() == logits.float().argmax(-1).tolist()
    assert lengths.tolist() == [1] * 8
    cpu = ts.create_backend("greedy", ts.SamplingBackendConfig(
        max_bs=8, max_req_pool_size=8, vocab_size=V, device="cpu"))
    cpu_tokens, _ = cpu.sample(ts.LogitsProcessorOutput(logits.cpu()), ts.SamplingBatchInfo(
        torch.arange(1, 9, dtype=torch.int32), torch.zeros(9, dtype=torch.int32), V, "cpu"))
    assert tokens.cpu().tolist() == cpu_tokens.tolist()


def test_ties_nan_and_all_minus_inf():
    V = 5000
    logits = torch.randn(4, V, device="cuda")
    logits[0, [4000, 17, 999]] = 50.0              # tie -> lowest index 17
    logits[1, :] = float("nan")
    logits[1, 4321] = -3.0                          # NaN counts as -inf
    logits[2, :] = float("-inf")                    # all -inf -> 0
    logits[3, [10, 4999]] = float("inf")            # +inf tie -> 10
    b = backend(V)
    tokens, _ = b.sample(ts.LogitsProcessorOutput(logits), info(4, V))
    assert tokens.tolist() == [17, 4321, 0, 10]
    assert b.invalid_rows[:4].tolist() == [False, False, True, False]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_argmax_invalid_flags_match_cpu_with_a_bitmask(dtype):
    """argmax_rows' out_invalid (DESIGN §3.1) on CUDA equals the CPU kernel's, on rows made
    invalid by -inf, NaN or the grammar mask, and on rows one allowed entry keeps valid."""
    V = 40000
    words = (V + 31) // 32
    logits = torch.randn(6, V).to(dtype)
    bits = torch.full((6, words), -1, dtype=torch.int32)
    logits[0] = float("-inf")
    logits[1] = float("nan")
    bits[2] = 0                                   # every token disallowed
    bits[3] = 0
    bits[3, 1000] = 1 << 5                        # token 32005 alone allowed
    logits[4] = float("-inf")
    logits[4, 39999] = float("inf")
    logits[5, 123] = float("nan")
    out = {}
    for device in ("cpu", "cuda"):
        tokens = torch.full((6,), -1, dtype=torch.int32, device=device)
        invalid = torch.ones(6, dtype=torch.bool, device=device)
        torch.ops.tokensampler.argmax_rows(logits.to(device), tokens, bits.to(device), invalid)
        out[device] = (tokens.cpu(), invalid.cpu())
    assert torch.equal(out["cuda"][0], out["cpu"][0])
    assert torch.equal(out["cuda"][1], out["cpu"][1])
    assert out["cpu"][1].tolist() == [True, True, True, False, False, False]
    assert out["cpu"][0].tolist()[:5] == [0, 0, 0, 32005, 39999]


@pytest.mark.parametrize("rows", [1, 16, 17, 33, 66, 67, 200])
@pytest.mark.parametrize("V", [7, 151936])
def test_argmax_rows_at_every_cluster_size(rows, V):
    """Small steps read a row with a cluster of 8, 4 or 2 blocks (one wave), larger ones a block
    a row: the same argmax, ties across the blocks' slices to the lowest id."""
    gen = torch.Generator().manual_seed(rows)
    logits = torch.randn(rows, V, generator=gen)
    logits[0, [V - 1, V // 3, V // 2]] = 9.0        # a tie across slices -> V // 3
    logits[-1] = float("-inf")                      # invalid -> 0
    tokens = torch.full((rows,), -1, dtype=torch.int32, device="cuda")
    invalid = torch.zeros(rows, dtype=torch.bool, device="cuda")
    torch.ops.tokensampler.argmax_rows(logits.cuda(), tokens, None, invalid)
    expected = torch.empty(rows, dtype=torch.int32)
    expected_invalid = torch.zeros(rows, dtype=torch.bool)
    torch.ops.tokensampler.argmax_rows(logits, expected, None, expected_invalid)
    assert torch.equal(tokens.cpu(), expected) and torch.equal(invalid.cpu(), expected_invalid)
    if rows > 1:
        assert expected[0].item() == V // 3 and expected[-1].item() == 0


def test_greedy_verify_on_cuda():
    V, n = 3000, 4
    logits = torch.randn(2 * n, V, device="cuda")
    target = logits.argmax(-1).to(torch.int32).view(2, n)
    candidates = torch.stack([torch.tensor([1, 2], device="cuda", dtype=torch.int32),
                              target[:, 0], target[:, 1], target[:, 2]], 1)
    candidates[1, 2] = (target[1, 1] + 1) % V
    predict, accept = backend(V).verify(ts.LogitsProcessorOutput(logits), info(2, V), candidates)
    assert accept.tolist() == [4, 2]
    assert predict[:4].tolist() == target[0].tolist()


@pytest.mark.parametrize("mode", ["raw", "processed"])
@pytest.mark.parametrize("top_n", [0, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("V", [50257, 151936])
def test_greedy_logprobs_match_cpu(mode, top_n, dtype, V):
    """With logprobs the greedy backend runs argmax_rows and the raw_logprobs op (raw), or the
    sampling kernels on one greedy slot (processed: the one-block kernel, then the top-N
    kernels): sample and verify, under a grammar bitmask, give the CPU's tokens, verify targets,
    invalid flags and top-N ids exactly and its logprobs to 1e-4 (-inf exactly); every shape
    holds an invalid row, and each backend steps twice at one row."""
    gen = torch.Generator().manual_seed(V + top_n)
    words = (V + 31) // 32
    backends = {device: ts.create_backend("greedy", ts.SamplingBackendConfig(
        max_bs=8, max_draft_tokens_per_req=4, max_req_pool_size=8, vocab_size=V, device=device,
        enable_output_logprobs=True, logprobs_mode=mode, top_logprobs_num=top_n,
        enable_token_bitmask=True)) for device in ("cpu", "cuda")}
    for bs, n in ((1, 1), (1, 1), (6, 1), (2, 3), (2, 3)):
        rows = bs * n
        logits = (torch.randn(rows, V, generator=gen) * 3).to(dtype)
        bits = torch.randint(-2**31, 2**31 - 1, (rows, words), generator=gen, dtype=torch.int32)
        invalid_row = int(torch.randint(0, rows, (1,), generator=gen))
        if invalid_row % 2:
            bits[invalid_row] = 0                    # every token disallowed
        else:
            logits[invalid_row] = float("-inf")      # no finite logit
        candidates = torch.randint(0, V, (bs, n), generator=gen, dtype=torch.int32)
        out = {}
        for device, b in backends.items():
            lpo = ts.LogitsProcessorOutput(logits.to(device))
            info = ts.SamplingBatchInfo(
                torch.arange(1, bs + 1, dtype=torch.int32, device=device),
                torch.zeros(9, dtype=torch.int32, device=device), V, device,
                token_bitmask=bits.to(device))
            if n == 1:
                tokens, _ = b.sample(lpo, info)
            else:
                tokens, _ = b.verify(lpo, info, candidates.to(device))
            out[device] = [t.cpu().clone() for t in (
                tokens, b._rows(rows).target, b.invalid_rows[:rows], lpo.next_token_logprobs,
                *((lpo.next_token_top_logprobs_idx, lpo.next_token_top_logprobs_val)
                  if top_n else ()))]
        cpu, gpu = out["cpu"], out["cuda"]
        assert cpu[2][invalid_row]
        # tokens, verify targets (sample: unused), invalid flags and top-N ids exactly
        for i in (0, 1, 2, 4) if top_n else (0, 1, 2):
            assert torch.equal(cpu[i], gpu[i]), (bs, n, i)
        for i in (3, 5) if top_n else (3,):  # logprobs, top-N values
            fin = torch.isfinite(cpu[i])
            assert torch.equal(fin, torch.isfinite(gpu[i])) and torch.equal(cpu[i][~fin], gpu[i][~fin])
            torch.testing.assert_close(cpu[i][fin], gpu[i][fin], atol=1e-4, rtol=0)
