import math

import pytest

import tokensampler as ts


def test_defaults_normalize_and_are_idempotent():
    sp = ts.SamplingParams(temperature=1, top_k=5, logit_bias={"3": 1, 4: -2.5})
    sp.normalize(10)
    assert sp.temperature == 1.0 and isinstance(sp.temperature, float)
    assert sp.logit_bias == {3: 1.0, 4: -2.5}
    before = dict(vars(sp))
    sp.normalize(10)
    assert vars(sp) == before


@pytest.mark.parametrize("field,value", [
    ("temperature", -0.1), ("temperature", math.inf), ("temperature", math.nan),
    ("top_p", 0.0), ("top_p", 1.5), ("top_p", math.nan),
    ("min_p", -0.1), ("min_p", 1.01), ("min_p", math.nan),
    ("frequency_penalty", 2.5), ("frequency_penalty", math.nan),
    ("presence_penalty", -3.0), ("presence_penalty", math.nan),
    ("repetition_penalty", 0.0), ("repetition_penalty", -1.0), ("repetition_penalty", math.inf),
    ("repetition_penalty", math.nan),
    # finite as float64, out of range once stored as float32 (inf, or 0 where 0 is excluded)
    ("temperature", 1e39), ("repetition_penalty", 1e39), ("repetition_penalty", 1e-46),
    ("top_p", 1e-46),
    ("top_k", 0), ("top_k", -2), ("top_k", 2**31),
    ("seed", -1), ("seed", 2**64),
])
def test_out_of_range_field_raises_value_error_naming_it(field, value):
    sp = ts.SamplingParams(**{field: value})
    with pytest.raises(ValueError, match=field):
        sp.normalize(100)


def test_float32_edge_values_are_kept():
    """Values float32 holds (its largest finite value, its smallest denormal) are accepted."""
    ts.SamplingParams(temperature=3.4028234e38, repetition_penalty=1.4e-45,
                      top_p=1.4e-45).normalize(100)


@pytest.mark.parametrize("field,value", [
    ("temperature", "hot"), ("top_k", 2.5), ("top_k", True), ("seed", 1.5), ("top_p", None),
])
def test_wrong_type_raises_type_error_naming_it(field, value):
    with pytest.raises(TypeError, match=field):
        ts.SamplingParams(**{field: value}).normalize(100)


def test_logit_bias_validation():
    with pytest.raises(ValueError, match="logit_bias token 100"):
        ts.SamplingParams(logit_bias={100: 1.0}).normalize(100)
    with pytest.raises(ValueError, match="logit_bias token -1"):
        ts.SamplingParams(logit_bias={-1: 1.0}).normalize(100)
    with pytest.raises(ValueError, match="nan"):
        ts.SamplingParams(logit_bias={1: math.nan}).normalize(100)
    with pytest.raises(TypeError, match="logit_bias key"):
        ts.SamplingParams(logit_bias={"abc": 1.0}).normalize(100)
    with pytest.raises(TypeError, match="logit_bias"):
        ts.SamplingParams(logit_bias=[1, 2]).normalize(100)


def test_resolve_seed_is_deterministic_and_63_bit():
    a, b = ts.SamplingParams(), ts.SamplingParams()
    assert a.resolve_seed("rid-1") == b.resolve_seed("rid-1")
    assert 0 <= a.seed < 2**63
    assert ts.SamplingParams().resolve_seed("rid-2") != a.seed
    fixed = ts.SamplingParams(seed=7)
    assert fixed.resolve_seed("anything") == 7


@pytest.mark.parametrize("field,value", [
    ("max_bs", 0), ("vocab_size", 0), ("vocab_size", 2**20 + 1), ("max_req_pool_size", -1),
    ("logprobs_mode", "cooked"), ("top_logprobs_num", -1), ("device", "tpu"),
    ("max_draft_tokens_per_req", 0),
])
def test_config_validation_names_field(field, value):
    cfg = ts.SamplingBackendConfig(max_bs=2, max_req_pool_size=2, vocab_size=10, device="cpu")
    setattr(cfg, field, value)
    with pytest.raises(ValueError, match=field):
        ts.create_backend("gumbel", cfg)


def test_unknown_backend_lists_names():
    cfg = ts.SamplingBackendConfig(max_bs=1, max_req_pool_size=1, vocab_size=10, device="cpu")
    with pytest.raises(ValueError, match="gumbel_full"):
        ts.create_backend("nope", cfg)
    assert {"greedy", "gumbel", "gumbel_full"} <= set(ts.available_backends())


@pytest.mark.parametrize("penalty", [dict(repetition_penalty=2.0), dict(frequency_penalty=0.5),
                                     dict(presence_penalty=-0.5)])
def test_penalties_without_history_are_refused_naming_the_capacity(penalty):
    """gumbel_full built with penalty_history_capacity=0 keeps no token history (prompt or
    output): a penalty, which would read it, is refused at prepare_step, before any slot
    changes; logit bias, which needs none, is served."""
    import torch

    b = ts.create_backend("gumbel_full", ts.SamplingBackendConfig(
        max_bs=2, max_req_pool_size=4, vocab_size=64, device="cpu", penalty_history_capacity=0))
    before = b.slots.table.clone()
    with pytest.raises(ValueError, match="penalty_history_capacity=0"):
        b.prepare_step(["a", "b"], [1, 2], [ts.SamplingParams(), ts.SamplingParams(**penalty)],
                       prompt_token_ids=[[5], [5]])
    assert torch.equal(b.slots.table, before) and b.slots.owner(1) is None
    b.prepare_step(["a"], [1], [ts.SamplingParams(temperature=0.0, logit_bias={7: 100.0})])
    logits = torch.zeros(1, 64)
    info = ts.SamplingBatchInfo(torch.tensor([1], dtype=torch.int32),
                                torch.zeros(5, dtype=torch.int32), 64, "cpu")
    assert b.sample(ts.LogitsProcessorOutput(logits), info)[0].tolist() == [7]
