"""Every op of torch.ops.tokensampler passes torch.library.opcheck (schema, autograd
registration, fake tensors, AOT dispatch with static and dynamic shapes), and the Meta kernels
refuse exactly what the real kernels refuse (one set of checks, csrc/ops/op_checks.h)."""

from __future__ import annotations

import pytest
import torch

import tokensampler as ts
from tokensampler import _C
from tokensampler.backends.slot_params import to_slot_params

OPS = torch.ops.tokensampler
V, H, B, POOL = 64, 16, 4, 5
ALL_TEST_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor",
                  "test_aot_dispatch_static", "test_aot_dispatch_dynamic")
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def _slot_table(device, full=True):
    """A slot table with four requests: top-k + top-p, min-p with penalties and a bias, greedy
    and plain sampling; slot 4 has a history of three tokens."""
    mgr = _C.SlotStateManager(pool_rows=POOL, vocab_size=V, history_capacity=H if full else 0,
                              bias_capacity=B if full else 0, with_min_p=full, device="cpu")
    params = [ts.SamplingParams(temperature=0.8, top_k=5, top_p=0.9, seed=1),
              ts.SamplingParams(min_p=0.1, repetition_penalty=1.3, frequency_penalty=0.4,
                                logit_bias={3: 2.0} if full else None, seed=2),
              ts.SamplingParams(temperature=0.0),
              ts.SamplingParams(seed=4, presence_penalty=0.5)]
    rids = [f"r{i}" for i in range(4)]
    mgr.prepare_step(rids, [1, 2, 3, 4], [to_slot_params(p, r, V) for p, r in zip(params, rids)],
                     [[1, 2, 3], [4, 5], [], [7, 7, 9]])
    return mgr, mgr.table.to(device)


def _logits(rows, device, dtype=torch.float32, requires_grad=False):
    x = torch.randn(rows, V, generator=torch.Generator().manual_seed(rows)).to(dtype)
    x[0, 7] = float("nan")
    return x.to(device).requires_grad_(requires_grad)


def _int32(values, device):
    return torch.tensor(values, dtype=torch.int32, device=device)


def argmax_rows_cases(device):
    for dtype in (torch.float32, torch.bfloat16):
        yield (_logits(3, device, dtype, requires_grad=dtype == torch.float32),
               torch.empty(3, dtype=torch.int32, device=device))
    yield (_logits(3, device, torch.float32), torch.empty(3, dtype=torch.int32, device=device),
           None, torch.empty(3, dtype=torch.bool, device=device))


def sample_rows_cases(device):
    mgr, table = _slot_table(device)
    lengths = _int32([0, 5, 9, 2, 30], device)
    for n, top_n, mode, route, max_top_k, requires_grad in [
            (1, 0, 0, int(_C.Route.GENERIC), 0, True), (1, 3, 1, int(_C.Route.TOP_K), 5, False),
            (2, 0, 1, int(_C.Route.TOP_K_TOP_P), 5, False)]:
        bs = 4
        rows = bs * n
        candidates = None if n == 1 else _int32([[0, 5]] * bs, device)
        workspace = torch.zeros(_C.sample_rows_workspace_bytes(rows), dtype=torch.uint8,
                                device=device)
        yield (_logits(rows, device, requires_grad=requires_grad), _int32([1, 2, 3, 4], device),
               lengths, table, mgr.history_capacity, mgr.bias_capacity, n, candidates, True, mode,
               route, max_top_k, torch.empty(rows, dtype=torch.int32, device=device),
               torch.empty(rows, dtype=torch.bool, device=device),
               torch.empty(rows, dtype=torch.float32, device=device),
               torch.empty(rows, top_n, dtype=torch.float32, device=device) if top_n else None,
               torch.empty(rows, top_n, dtype=torch.int64, device=device) if top_n else None,
               workspace)


def verify_chain_cases(device):
    candidates = _int32([[0, 4, 5], [0, 6, 6]], device)
    yield (candidates, _int32([4, 5, 1, 6, 2, 3], device),
           torch.empty(6, dtype=torch.int32, device=device),
           torch.empty(2, dtype=torch.int32, device=device))
    yield (candidates, _int32([4, 5, 1, 6, 2, 3], device),
           torch.empty(6, dtype=torch.int32, device=device),
           torch.empty(2, dtype=torch.int32, device=device),
           torch.tensor([False, True, False, False, False, False], device=device))


def verify_rejection_cases(device):
    mgr, table = _slot_table(device)
    bs, n = 4, 3
    draft = torch.softmax(torch.randn(bs, n - 1, V, generator=torch.Generator().manual_seed(3)), -1)
    candidates = torch.cat([torch.zeros(bs, 1, dtype=torch.int32),
                            draft.argmax(-1).to(torch.int32)], 1).contiguous()
    workspace = torch.zeros(_C.sample_rows_workspace_bytes(bs * n), dtype=torch.uint8,
                            device=device)
    # the one-block walker alone, then the split-row verdicts (a top-k route, with a workspace)
    for requires_grad, route, max_top_k, ws in ((False, _C.Route.GENERIC, 0, None),
                                                (True, _C.Route.GENERIC, 0, None),
                                                (False, _C.Route.TOP_K_TOP_P, 5, workspace)):
        yield (_logits(bs * n, device, requires_grad=requires_grad), _int32([1, 2, 3, 4], device),
               _int32([0, 5, 9, 2, 30], device), table, mgr.history_capacity, mgr.bias_capacity,
               candidates.to(device), draft.to(device).requires_grad_(requires_grad), True,
               int(route), max_top_k, torch.empty(bs * n, dtype=torch.int32, device=device),
               torch.empty(bs, dtype=torch.int32, device=device),
               torch.empty(bs * n, dtype=torch.bool, device=device), None, ws)


def penalize_logits_cases(device):
    mgr, table = _slot_table(device)
    for n, offset in ((1, 0), (2, 16)):
        rows = 4 * n
        candidates = None if n == 1 else _int32([[0, 5]] * 4, device)
        yield (_logits(rows, device, torch.bfloat16), _int32([1, 2, 3, 4], device), table,
               mgr.history_capacity, mgr.bias_capacity, n, candidates, offset,
               torch.empty(rows, V, dtype=torch.float32, device=device))


def gumbel_noise_cases(device):
    yield (torch.tensor([1, 2**40], device=device), torch.tensor([0, 7], device=device),
           _int32([[0, 1, 2], [5, 63, 9]], device), _C.RNG_STREAMS["gumbel"],
           torch.empty(2, 3, dtype=torch.float32, device=device))


def min_p_threshold_cases(device):
    yield (torch.tensor([0.0, 3.5, float("-inf"), float("inf")], device=device),
           torch.tensor([0.1, 0.0, 0.5, 0.9], device=device),
           torch.empty(4, dtype=torch.float32, device=device))


def append_history_cases(device):
    mgr, table = _slot_table(device)
    yield (table, mgr.history_capacity, mgr.bias_capacity, _int32([2, 4], device),
           _int32([5, 8, 9, 7, 7, 1], device), _int32([2, 3], device), 3)


def raw_logprobs_cases(device):
    bits = torch.full((3, (V + 31) // 32), -1, dtype=torch.int32)
    bits[1, 0] = 0  # tokens 0..31 of row 1 disallowed
    for dtype, top_n, mask in ((torch.float32, 0, None), (torch.bfloat16, 3, bits)):
        yield (_logits(3, device, dtype, requires_grad=dtype == torch.float32),
               _int32([5, -1, 63], device), torch.empty(3, dtype=torch.float32, device=device),
               torch.empty(3, top_n, dtype=torch.float32, device=device) if top_n else None,
               torch.empty(3, top_n, dtype=torch.int64, device=device) if top_n else None,
               None if mask is None else mask.to(device))
    # request 1's slot (9) outside a 4-row pool: its row is written without a read
    yield (_logits(3, device), _int32([5, 2, 63], device),
           torch.empty(3, dtype=torch.float32, device=device),
           torch.empty(3, 2, dtype=torch.float32, device=device),
           torch.empty(3, 2, dtype=torch.int64, device=device), None,
           _int32([0, 9, 1], device), 1, 4)


CASES = {
    "argmax_rows": argmax_rows_cases,
    "sample_rows": sample_rows_cases,
    "verify_chain": verify_chain_cases,
    "verify_rejection": verify_rejection_cases,
    "penalize_logits": penalize_logits_cases,
    "gumbel_noise": gumbel_noise_cases,
    "min_p_threshold": min_p_threshold_cases,
    "append_history": append_history_cases,
    "raw_logprobs": raw_logprobs_cases,
}


def test_every_op_has_cases():
    registered = {s.name.split("::")[1] for s in torch._C._jit_get_all_schemas()
                  if s.name.startswith("tokensampler::")}
    assert registered == set(CASES)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_opcheck(name, device):
    op = getattr(OPS, name).default
    for args in CASES[name](device):
        result = torch.library.opcheck(op, args, test_utils=ALL_TEST_UTILS)
        assert all(v == "SUCCESS" for v in result.values()), result
    assert {"Meta", "Autograd", "CPU"} <= {
        key for key in ("Meta", "Autograd", "CPU", "CUDA")
        if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key)}


def test_ops_record_no_autograd_history():
    """Non-differentiable: logits that require grad are read, and nothing the op writes joins
    the graph (the Autograd kernel runs the op below autograd)."""
    args = list(next(sample_rows_cases("cpu")))
    assert args[0].requires_grad
    OPS.sample_rows(*args)
    assert args[14].grad_fn is None and not args[14].requires_grad
    assert args[14]._version > 0  # ADInplaceOrView still bumps what the op wrote


def _to_meta(args):
    return [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]


def _bad_variants():
    """(op, description, args) that every kernel must refuse."""
    s = list(next(sample_rows_cases("cpu")))
    s[0] = s[0].detach()
    yield "sample_rows", "route out of range", s[:10] + [7] + s[11:]
    yield "sample_rows", "negative max_top_k", s[:11] + [-1] + s[12:]
    yield "sample_rows", "logprobs_mode 2", s[:9] + [2] + s[10:]
    yield "sample_rows", "int64 out_tokens", s[:12] + [s[12].long()] + s[13:]
    yield "sample_rows", "short out_invalid", s[:13] + [s[13][:2]] + s[14:]
    yield "sample_rows", "rows not a multiple of n", s[:6] + [3] + s[7:]
    yield "sample_rows", "int64 workspace", s[:17] + [s[17].long()]
    yield "sample_rows", "short workspace", s[:17] + [torch.zeros(1024, dtype=torch.uint8)]
    t = list(list(sample_rows_cases("cpu"))[1])  # the case with top-N outputs
    rows = t[0].size(0)
    yield "sample_rows", "top-N wider than the vocabulary", t[:15] + [
        torch.empty(rows, V + 1), torch.empty(rows, V + 1, dtype=torch.int64)] + t[17:]
    c = list(next(verify_chain_cases("cpu")))
    yield "verify_chain", "1-D candidates", [c[0].view(-1)] + c[1:]
    yield "verify_chain", "short target", [c[0], c[1][:4]] + c[2:]
    yield "verify_chain", "int64 candidates", [c[0].long()] + c[1:]
    yield "verify_chain", "int32 target_invalid", c + [torch.zeros(6, dtype=torch.int32)]
    yield "verify_chain", "short target_invalid", c + [torch.zeros(5, dtype=torch.bool)]
    r = list(next(verify_rejection_cases("cpu")))
    yield "verify_rejection", "draft_probs width", r[:7] + [r[7][:, :, :-1]] + r[8:]
    yield "verify_rejection", "more candidates than logits rows", r[:6] + [
        torch.cat([r[6], r[6]])] + r[7:]
    yield "verify_rejection", "route out of range", r[:9] + [-1] + r[10:]
    yield "verify_rejection", "short workspace", r[:15] + [torch.zeros(1024, dtype=torch.uint8)]
    h = list(next(append_history_cases("cpu")))
    narrow = _C.SLOT_COLUMNS["history_len"] + 1  # narrower than the scalars alone
    yield "append_history", "table width", [h[0][:, :narrow].contiguous()] + h[1:]
    yield "append_history", "short tokens", h[:4] + [h[4][:5]] + h[5:]
    yield "append_history", "tokens_per_req 0", h[:6] + [0]
    p = list(next(penalize_logits_cases("cpu")))
    yield "penalize_logits", "out shape", p[:8] + [p[8][:, :-1]]
    g = list(next(gumbel_noise_cases("cpu")))
    yield "gumbel_noise", "int32 seeds", [g[0].int()] + g[1:]
    m = list(next(min_p_threshold_cases("cpu")))
    yield "min_p_threshold", "float64 min_p", [m[0], m[1].double(), m[2]]
    yield "min_p_threshold", "short out", [m[0], m[1], m[2][:3]]
    lp = list(list(raw_logprobs_cases("cpu"))[1])  # with top-N and a bitmask
    lp[0] = lp[0].detach()
    yield "raw_logprobs", "int64 tokens", [lp[0], lp[1].long()] + lp[2:]
    yield "raw_logprobs", "short tokens", [lp[0], lp[1][:2]] + lp[2:]
    yield "raw_logprobs", "top-N without ids", lp[:4] + [None, lp[5]]
    yield "raw_logprobs", "bitmask rows", lp[:5] + [lp[5][:2]]
    s = list(list(raw_logprobs_cases("cpu"))[2])  # with req_pool_indices
    yield "raw_logprobs", "short req_pool_indices", s[:6] + [s[6][:2]] + s[7:]
    yield "raw_logprobs", "tokens_per_req 2 of 3 rows", s[:7] + [2, s[8]]
    yield "raw_logprobs", "negative pool_rows", s[:8] + [-1]
    a = list(next(argmax_rows_cases("cpu")))
    yield "argmax_rows", "3-D logits", [a[0].detach().view(1, 3, V), a[1]]
    yield "argmax_rows", "int32 out_invalid", [a[0].detach(), a[1], None,
                                               torch.empty(3, dtype=torch.int32)]
    yield "argmax_rows", "short out_invalid", [a[0].detach(), a[1], None,
                                               torch.empty(2, dtype=torch.bool)]


@pytest.mark.parametrize("name,what,args", list(_bad_variants()),
                         ids=[f"{n}-{w}" for n, w, _ in _bad_variants()])
def test_meta_kernel_refuses_what_the_cpu_kernel_refuses(name, what, args,
                                                        cpp_exceptions_reach_python):
    if not cpp_exceptions_reach_python:
        pytest.skip("C++ exceptions from extensions crash this machine's torch build")
    op = getattr(OPS, name)
    with pytest.raises((ValueError, TypeError)) as cpu:
        op(*args)
    with pytest.raises(cpu.type) as meta:
        op(*_to_meta(args))
    assert str(meta.value).split("\n")[0] == str(cpu.value).split("\n")[0].replace("cpu", "meta")
