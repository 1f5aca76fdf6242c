"""Slot-state invariants (the seed test's, restated against tokensampler's API)."""

import pytest
import torch

import tokensampler as ts
from tokensampler import graphs

from helpers import POOL, VOCAB, batch_info, make_config, sample_once


def sp(**kw):
    kw.setdefault("seed", 1)
    return ts.SamplingParams(**kw)


@pytest.fixture(params=["gumbel", "gumbel_full"])
def backend(request):
    return ts.create_backend(request.param, make_config())


@pytest.fixture
def full():
    return ts.create_backend("gumbel_full", make_config())


def test_greedy_has_no_pool_state():
    b = ts.create_backend("greedy", make_config())
    assert not hasattr(b, "slots")
    b.prepare_step(["a", "b"], [1, 2], [sp(), sp(temperature=0.5)])
    # no state, but the same validation as every backend
    with pytest.raises(ValueError, match=r"request_pool_indices\[0\]=999"):
        b.prepare_step(["a", "b"], [999, -1], [sp(), sp()])


def test_first_admission_flips_and_scatters(backend):
    backend.prepare_step(["a", "b"], [1, 3], [
        sp(temperature=0.7, top_k=50, top_p=0.9, seed=42),
        sp(temperature=1.2, top_k=20, top_p=0.8, seed=2**40 + 123)])
    assert backend.slots.owner(1) == "a" and backend.slots.owner(3) == "b"
    assert backend.temperature_pool[1].item() == pytest.approx(0.7)
    assert backend.top_k_pool[1].item() == 50
    assert backend.top_p_pool[1].item() == pytest.approx(0.9)
    assert backend.seed_pool[1].item() == 42
    assert backend.temperature_pool[3].item() == pytest.approx(1.2)
    assert backend.top_k_pool[3].item() == 20
    assert backend.seed_pool[3].item() == 2**40 + 123
    # untouched slots keep neutral values
    assert backend.temperature_pool[0].item() == 1.0
    assert backend.temperature_pool[5].item() == 1.0
    assert backend.top_k_pool[5].item() == -1


@pytest.mark.parametrize("bs", [1, 3])
def test_row_params_gathers_the_pools(backend, bs):
    """The per-row parameters that samplers outside the kernels read (FlashInfer adapters,
    vocab-parallel sampling), one request included: seeds with the high bit set survive."""
    seeds = [42, 2**63 + 5, 2**40 + 123][:bs]
    slots = [3, 1, 5][:bs]
    backend.prepare_step([f"r{i}" for i in range(bs)], slots,
                         [sp(temperature=0.5 + i, top_k=10 + i, seed=s) for i, s in enumerate(seeds)])
    info = ts.SamplingBatchInfo(torch.tensor(slots, dtype=torch.int32),
                                torch.arange(8, dtype=torch.int32) * 10, 100, "cpu")
    p = backend.row_params(info, 2, bs)
    expect = [s - 2**64 if s >= 2**63 else s for s in seeds]
    assert p.seed.tolist() == [s for s in expect for _ in range(2)]
    assert p.position.tolist() == [x for sl in slots for x in (10 * sl, 10 * sl + 1)]
    assert p.top_k.tolist() == [10 + i for i in range(bs) for _ in range(2)]
    assert p.temperature.tolist() == pytest.approx([0.5 + i for i in range(bs) for _ in range(2)])


def test_steady_requests_reuse_their_conversion_new_objects_are_read(backend):
    """prepare_step converts a request's SamplingParams when it brings a new object; the same
    object next step reuses the conversion (the host cost of a steady step); the step's largest
    top-k and route follow what the step's slots hold."""
    a, b = sp(temperature=0.7, top_k=40), sp(temperature=0.7, top_k=300)
    backend.prepare_step(["a", "b"], [1, 2], [a, b])
    assert backend.step_max_top_k == 300
    converted = dict(backend._converted)
    backend.prepare_step(["a", "b"], [1, 2], [a, b])
    assert all(backend._converted[r] is converted[r] for r in "ab")
    backend.prepare_step(["a"], [1], [a])
    assert backend.step_max_top_k == 40
    with pytest.raises(ValueError, match="temperature"):
        backend.prepare_step(["a"], [1], [sp(temperature=-1.0)])
    assert backend._converted["a"].source is a  # a refused step changes nothing
    # a new object for a request that keeps its slot: validated, but the slot and the route
    # keep the parameters of the flip (changing them mid-request is outside the contract)
    backend.prepare_step(["a"], [1], [sp(temperature=0.0)])
    assert backend.step_max_top_k == 40 and backend.route == "top_k"
    assert backend.temperature_pool[1].item() == pytest.approx(0.7)
    backend.prepare_step(["c"], [1], [sp(temperature=0.0)])  # a flip writes the new request
    assert backend.step_max_top_k == 1 and backend.temperature_pool[1].item() == 0.0


def test_unseeded_request_gets_rid_derived_seed(backend):
    backend.prepare_step(["rid-x"], [2], [ts.SamplingParams()])
    assert backend.seed_pool[2].item() == ts.SamplingParams().resolve_seed("rid-x")


def test_steady_state_does_not_rewrite(backend):
    backend.prepare_step(["a"], [2], [sp(temperature=0.7)])
    written = backend.slots.rows_written
    backend.temperature_pool[2] = 9.999  # a sentinel a re-flip would overwrite
    backend.prepare_step(["a"], [2], [sp(temperature=0.7)])
    assert backend.slots.rows_written == written
    assert backend.temperature_pool[2].item() == pytest.approx(9.999)


def test_slot_recycle_flips(backend):
    backend.prepare_step(["a"], [2], [sp(temperature=0.7, seed=1)])
    backend.prepare_step(["b"], [2], [sp(temperature=0.3, seed=99)])
    assert backend.slots.owner(2) == "b"
    assert backend.temperature_pool[2].item() == pytest.approx(0.3)
    assert backend.seed_pool[2].item() == 99


def test_a_request_that_comes_back_to_a_slot_it_left_flips_it(backend):
    """A request owns one slot: after moving 1 -> 2, slot 1 is no longer its own, so moving
    back 2 -> 1 rewrites slot 1 with its latest parameters (DESIGN §2), and the route follows
    them; swaps within one step too."""
    backend.prepare_step(["x"], [1], [sp(temperature=0.0)])
    latest = sp(temperature=1.0, top_k=5, seed=7)
    backend.prepare_step(["x"], [2], [latest])
    assert backend.slots.owner(1) is None and backend.slots.owner(2) == "x"
    backend.prepare_step(["x"], [1], [latest])
    assert backend.slots.owner(1) == "x" and backend.slots.owner(2) is None
    assert backend.temperature_pool[1].item() == pytest.approx(1.0)
    assert backend.seed_pool[1].item() == 7
    assert backend.cuda_graph_replay_variant(1) == "top_k"
    backend.prepare_step(["x", "y"], [1, 2], [latest, sp(temperature=0.3, seed=8)])
    backend.prepare_step(["x", "y"], [2, 1], [latest, sp(temperature=0.3, seed=8)])  # a swap
    assert backend.slots.owner(1) == "y" and backend.slots.owner(2) == "x"
    assert backend.seed_pool[1].item() == 8 and backend.seed_pool[2].item() == 7


def test_full_scatters_penalties_min_p_and_bias(full):
    full.prepare_step(["a"], [3], [sp(frequency_penalty=0.5, presence_penalty=0.25,
                                      repetition_penalty=1.2, min_p=0.1,
                                      logit_bias={"100": 2.0, 200: -1.5})])
    assert full.frequency_penalty_pool[3].item() == pytest.approx(0.5)
    assert full.presence_penalty_pool[3].item() == pytest.approx(0.25)
    assert full.repetition_penalty_pool[3].item() == pytest.approx(1.2)
    assert full.min_p_pool[3].item() == pytest.approx(0.1)
    assert full.logit_bias(3) == {100: 2.0, 200: -1.5}


def test_flip_clears_history_and_bias(full):
    full.prepare_step(["old"], [2], [sp(temperature=0.0, frequency_penalty=1.0,
                                        repetition_penalty=1.5, logit_bias={7: 3.0})],
                      prompt_token_ids=[[5, 6, 5]])
    assert full.penalty_history(2) == {5: 0, 6: 0}
    logits = torch.zeros(1, VOCAB)
    logits[0, 9] = 5.0
    sample_once(full, logits, [2])
    assert full.penalty_history(2) == {5: 0, 6: 0, 9: 1}
    full.prepare_step(["new"], [2], [sp()])
    assert full.penalty_history(2) == {}
    assert full.logit_bias(2) == {}


def test_a_flip_leaves_no_trace_of_the_previous_request(full):
    """A flip writes only a prefix of the row (slot_layout.h): the lists are emptied by their
    lengths and the prompt mask is rewritten only where the slot had one or gets one. Whatever
    the previous owner left (prompt mask, output history, a longer bias list), the slot then
    holds what a never-used slot given the same request holds, and samples the same."""
    fresh = ts.create_backend("gumbel_full", make_config())
    rich = sp(temperature=0.0, frequency_penalty=1.0, repetition_penalty=1.5,
              logit_bias={t: 0.5 for t in range(20, 40)})
    full.prepare_step(["old1", "old2"], [2, 3], [rich, rich], prompt_token_ids=[[5, 6], [7]])
    logits = torch.zeros(2, VOCAB)
    logits[:, 9] = 5.0
    sample_once(full, logits, [2, 3])
    assert full.penalty_history(2) == {5: 0, 6: 0, 9: 1}
    # one step: slot 2 to a request with a repetition penalty and no prompt (its mask must be
    # cleared), slot 3 to one with a new prompt and a shorter bias list, slot 4 (never used) to
    # a plain one
    new = [sp(repetition_penalty=1.3, logit_bias={50: 1.0}),
           sp(repetition_penalty=1.2, logit_bias={1: -1.0}), sp()]
    prompts = [None, [8, 9, 8], None]
    full.prepare_step(["n2", "n3", "n4"], [2, 3, 4], new, prompt_token_ids=prompts)
    fresh.prepare_step(["n2", "n3", "n4"], [5, 6, 7], new, prompt_token_ids=prompts)
    for slot, fresh_slot in ((2, 5), (3, 6), (4, 7)):
        assert full.penalty_history(slot) == fresh.penalty_history(fresh_slot)
        assert full.logit_bias(slot) == fresh.logit_bias(fresh_slot)
    assert full.penalty_history(3) == {8: 0, 9: 0}
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(0))
    assert torch.equal(sample_once(full, logits, [2, 3, 4])[0], sample_once(fresh, logits, [5, 6, 7])[0])
    # and back to neutral: reset_capture_state clears slot 0's prompt mask too
    full.prepare_step(["warm"], [0], [sp(repetition_penalty=1.5)], prompt_token_ids=[[3]])
    assert full.penalty_history(0) == {3: 0}
    full.reset_capture_state()
    assert full.penalty_history(0) == {}


def test_history_of_slot_zero_is_cleared_by_reset_capture_state(full):
    full.prepare_step(["warm"], [0], [sp(temperature=0.0, frequency_penalty=1.0)])
    sample_once(full, torch.randn(1, VOCAB), [0])
    assert full.penalty_history(0)
    full.reset_capture_state()
    assert full.penalty_history(0) == {}
    assert full.slots.owner(0) is None


def test_out_of_vocab_bias_raises_and_leaves_state(full):
    full.prepare_step(["a"], [1], [sp(temperature=0.5)])
    before = full.slots.table.clone()
    with pytest.raises(ValueError, match="logit_bias token"):
        full.prepare_step(["b"], [1], [sp(logit_bias={str(VOCAB + 5): 1.0})])
    assert torch.equal(full.slots.table, before)
    assert full.slots.owner(1) == "a"


def test_misaligned_lists_raise_and_leave_state(backend):
    before = backend.slots.table.clone()
    with pytest.raises(ValueError, match="aligned"):
        backend.prepare_step(["a", "b"], [1], [sp(), sp()])
    with pytest.raises(ValueError, match="aligned"):
        backend.prepare_step(["a", "b"], [1, 2], [sp()])
    with pytest.raises(ValueError, match="aligned"):
        backend.prepare_step(["a"], [1], [sp()], prompt_token_ids=[[1], [2]])
    assert torch.equal(backend.slots.table, before)
    assert backend.slots.owner(1) is None


@pytest.mark.parametrize("bad", [POOL + 1, -1, 10**6])
def test_pool_index_out_of_range_raises_and_leaves_state(backend, bad):
    before = backend.slots.table.clone()
    with pytest.raises(ValueError, match="outside"):
        backend.prepare_step(["a", "b"], [1, bad], [sp(temperature=0.3), sp()])
    assert torch.equal(backend.slots.table, before)
    assert backend.slots.owner(1) is None  # the valid first request was not half-applied


def test_invalid_params_in_one_request_leave_others_untouched(backend):
    before = backend.slots.table.clone()
    with pytest.raises(ValueError, match="top_p"):
        backend.prepare_step(["a", "b"], [1, 2], [sp(temperature=0.3), sp(top_p=2.0)])
    assert torch.equal(backend.slots.table, before)


def test_prompt_beyond_history_capacity_is_kept_in_the_prompt_mask(full):
    """Prompt tokens live in a V-bit mask, not in the output history: a prompt with more
    distinct tokens than penalty_history_capacity is accepted and every token is penalised."""
    small = ts.create_backend("gumbel_full", make_config(penalty_history_capacity=4))
    prompt = list(range(0, VOCAB, 3))  # 342 distinct tokens, capacity 4
    small.prepare_step(["a"], [1], [sp(repetition_penalty=1.2)], prompt_token_ids=[prompt])
    assert small.penalty_history(1) == {t: 0 for t in prompt}
    assert small.slots.prompt_mask_words == (VOCAB + 31) // 32
    # greedy: every prompt token's positive logit is divided by 1.2, so token 1 (not in the
    # prompt, logit 5.5) beats token 3 * 300 (prompt, logit 6 -> 5)
    logits = torch.zeros(1, VOCAB)
    logits[0, 900], logits[0, 1] = 6.0, 5.5
    small.prepare_step(["b"], [2], [sp(temperature=0.0, repetition_penalty=1.2)],
                       prompt_token_ids=[prompt])
    tokens, _, _ = sample_once(small, logits, [2])
    assert tokens.tolist() == [1]


ROUTE_CASES = [
    ([dict(top_k=-1, top_p=1.0), dict()], "no_filter"),
    ([dict(top_k=50)], "top_k"),
    ([dict(top_k=50, top_p=0.9)], "top_k_top_p"),
    ([dict(top_p=0.9)], "top_p"),
    ([dict(), dict(top_k=50)], "generic"),
    ([dict(top_k=50), dict(temperature=0.0)], "top_k"),  # greedy rows fit any route
    ([dict(top_k=VOCAB)], "no_filter"),                  # k >= V disables top-k
]


@pytest.mark.parametrize("params,route", ROUTE_CASES)
def test_route_selection(backend, params, route):
    rids = [f"r{i}" for i in range(len(params))]
    backend.prepare_step(rids, list(range(1, len(params) + 1)), [sp(**p) for p in params])
    assert backend.route == route


def test_min_p_routes_only_in_full_backend(full):
    plain = ts.create_backend("gumbel", make_config())
    with pytest.raises(ValueError, match="min_p=0.2.*gumbel_full"):  # it cannot honour min-p
        plain.prepare_step(["a"], [1], [sp(min_p=0.2)])
    full.prepare_step(["a"], [1], [sp(min_p=0.2)])
    assert full.route == "min_p"
    full.prepare_step(["b"], [1], [sp(top_k=64, top_p=0.9, min_p=0.05)])  # a flip
    assert full.route == "top_k_top_p_min_p"


def test_capture_variants_and_replay_selection(backend):
    base = (graphs.CUDA_GRAPH_VARIANT_DEFAULT, graphs.CUDA_GRAPH_VARIANT_NO_FILTER,
            graphs.CUDA_GRAPH_VARIANT_TOP_P, graphs.CUDA_GRAPH_VARIANT_TOP_K,
            graphs.CUDA_GRAPH_VARIANT_TOP_K_TOP_P)
    one, four = backend.cuda_graph_capture_variants(1), backend.cuda_graph_capture_variants(4)
    assert one[:5] == base
    assert graphs.CUDA_GRAPH_VARIANT_VERIFY_NO_FILTER in four
    assert graphs.CUDA_GRAPH_VARIANT_VERIFY_NO_FILTER not in one

    cases = [(dict(), 4, "verify_no_filter"), (dict(), 1, "no_filter"),
             (dict(top_p=0.9), 4, "top_p"), (dict(top_k=50), 4, "top_k"),
             (dict(top_k=50, top_p=0.9), 4, "top_k_top_p")]
    for i, (params, n, variant) in enumerate(cases):
        backend.prepare_step([f"a{i}"], [1], [sp(**params)], num_tokens_per_req=n)
        assert backend.cuda_graph_replay_variant(n) == variant
        assert variant in backend.cuda_graph_capture_variants(n)
    backend.prepare_step(["a", "b"], [1, 2], [sp(), sp(top_k=5)])
    assert backend.cuda_graph_replay_variant(1) == graphs.CUDA_GRAPH_VARIANT_DEFAULT


def test_prepare_capture_variant_sets_route(backend):
    for variant, route in [("top_k", "top_k"), ("top_k_top_p", "top_k_top_p"),
                           ("top_p", "top_p"), ("verify_no_filter", "no_filter"),
                           ("default", "generic")]:
        backend.prepare_capture_variant(bs=1, num_tokens_per_req=4, variant=variant)
        assert backend.route == route
    backend.prepare_step(["a"], [1], [sp(top_k=3)])
    backend.prepare_capture(bs=1)
    assert backend.route == "generic"
    with pytest.raises(ValueError, match="variant"):
        backend.prepare_capture_variant(bs=1, num_tokens_per_req=1, variant="nope")


def test_full_min_p_variants(full):
    variants = full.cuda_graph_capture_variants(4)
    assert graphs.CUDA_GRAPH_VARIANT_MIN_P in variants
    assert graphs.CUDA_GRAPH_VARIANT_TOP_K_TOP_P_MIN_P in variants
    full.prepare_step(["a"], [1], [sp(min_p=0.2)], num_tokens_per_req=4)
    assert full.cuda_graph_replay_variant(4) == graphs.CUDA_GRAPH_VARIANT_MIN_P


def test_num_tokens_per_req_beyond_config_raises(backend):
    with pytest.raises(ValueError, match="num_tokens_per_req"):
        backend.prepare_step(["a"], [1], [sp()], num_tokens_per_req=5)


def test_sample_rejects_logits_on_wrong_shape_or_dtype(backend):
    backend.prepare_step(["a"], [1], [sp()])
    with pytest.raises(ValueError, match="vocab_size"):
        sample_once(backend, torch.randn(1, VOCAB + 1), [1])
    with pytest.raises(TypeError, match="dtype"):
        sample_once(backend, torch.randn(1, VOCAB).double(), [1])
    with pytest.raises(ValueError, match="max_bs"):
        sample_once(backend, torch.randn(5, VOCAB), [1] * 5)


def test_packed_output_d2h(backend):
    backend.prepare_step(["a", "b"], [1, 2], [sp(), sp()])
    tokens, lengths, _ = sample_once(backend, torch.randn(2, VOCAB), [1, 2])
    t, l = backend.sample(ts.LogitsProcessorOutput(torch.randn(2, VOCAB)),
                          ts.SamplingBatchInfo(torch.tensor([1, 2], dtype=torch.int32),
                                               torch.zeros(POOL + 1, dtype=torch.int32), VOCAB, "cpu"))
    packed = backend.get_packed_output_d2h(t, l)
    assert packed is not None
    assert torch.equal(packed[0], t) and torch.equal(packed[1], l)
    assert backend.get_packed_output_d2h(t.clone(), l.clone()) is None


@pytest.mark.parametrize("name", ["greedy", "gumbel", "gumbel_full"])
def test_outputs_follow_the_step_size_across_steps(name):
    """Steps of 3, 1, 4 and again 3 requests (sample, verify, sample) return outputs of their
    own size and values, equal to a fresh backend's: the views a backend keeps per row count
    never leak one step's size or values into another's."""
    cfg = dict(max_draft_tokens_per_req=2, enable_output_logprobs=True, top_logprobs_num=2)
    b = ts.create_backend(name, make_config(**cfg))
    gen = torch.Generator().manual_seed(5)
    params = sp(temperature=0.0 if name == "greedy" else 0.8)
    for bs, n in ((3, 1), (1, 2), (4, 1), (3, 2), (3, 1)):
        slots = list(range(1, bs + 1))
        logits = torch.randn(bs * n, VOCAB, generator=gen)
        fresh = ts.create_backend(name, make_config(**cfg))
        results = []
        for backend in (b, fresh):
            backend.prepare_step([f"r{i}" for i in slots], slots, [params] * bs, n)
            out = ts.LogitsProcessorOutput(logits)
            info = batch_info(slots)
            if n == 1:
                tokens, lengths = backend.sample(out, info)
            else:
                tokens, lengths = backend.verify(out, info, torch.zeros(bs, n, dtype=torch.int32))
            results.append([t.clone() for t in (tokens, lengths, out.next_token_logprobs,
                                                out.next_token_top_logprobs_val,
                                                out.next_token_top_logprobs_idx)])
        assert [tuple(t.shape) for t in results[0][:3]] == [(bs * n,), (bs,), (bs * n,)]
        for ours, want in zip(*results):
            assert torch.equal(ours, want), (bs, n)


def test_workspace_is_sized_from_the_config_and_only_for_cuda(backend):
    """The CUDA kernels' scratch is allocated once, from max_bs * max_draft_tokens_per_req; the
    CPU kernels need none."""
    from tokensampler import _C

    assert backend._workspace is None  # a CPU backend
    per_row = _C.sample_rows_workspace_bytes(2) - _C.sample_rows_workspace_bytes(1)
    assert per_row > 0
    assert _C.sample_rows_workspace_bytes(512) == _C.sample_rows_workspace_bytes(1) + 511 * per_row
