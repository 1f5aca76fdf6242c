"""Inputs an outside audit found reaching past the one validation (DESIGN §5): each is refused
with a ValueError / TypeError naming the field, or (the config, the packed output) can no longer
give a wrong answer."""

import pytest
import torch

import tokensampler as ts

from helpers import VOCAB, batch_info, make_config, sample_once


def sp(**kw):
    return ts.SamplingParams(seed=1, **kw)


@pytest.mark.parametrize("field", [dict(logit_bias={1: float("-inf")}),
                                   dict(repetition_penalty=2.0), dict(frequency_penalty=0.5),
                                   dict(presence_penalty=-0.5)])
def test_greedy_refuses_what_would_change_its_argmax(field):
    """Penalties and bias change the argmax and the greedy backend keeps no history or bias:
    refused, naming the field and gumbel_full, before anything is written."""
    b = ts.create_backend("greedy", make_config())
    name = next(iter(field))
    with pytest.raises(ValueError, match=rf"rid='a'.*{name}.*gumbel_full"):
        b.prepare_step(["a"], [1], [sp(temperature=0.0, **field)])
    b.prepare_step(["a"], [1], [sp(temperature=0.7, top_k=5, top_p=0.5, min_p=0.1)])


def test_backend_keeps_its_own_copy_of_the_config():
    cfg = make_config(vocab_size=8)
    b = ts.create_backend("gumbel_full", cfg)
    cfg.vocab_size, cfg.max_bs = 16, 64
    assert (b.config.vocab_size, b.config.max_bs) == (8, 4)
    b.prepare_step(["a"], [1], [sp()])
    with pytest.raises(ValueError, match="vocab_size"):
        sample_once(b, torch.randn(1, 16), [1])


def test_a_cpu_device_with_an_index_samples():
    b = ts.create_backend("gumbel", make_config(device="cpu:0"))
    b.prepare_step(["a"], [1], [sp()])
    tokens, _, _ = sample_once(b, torch.randn(1, VOCAB), [1])
    assert 0 <= tokens.item() < VOCAB


@pytest.mark.parametrize("name", ["greedy", "gumbel"])
def test_packed_output_is_none_for_views_it_did_not_return(name):
    b = ts.create_backend(name, make_config())
    b.prepare_step(["a", "b"], [1, 2], [sp(), sp()], num_tokens_per_req=2)
    cands = torch.tensor([[1, 2], [3, 4]], dtype=torch.int32)
    predict, accept = b.verify(ts.LogitsProcessorOutput(torch.randn(4, VOCAB)),
                               batch_info([1, 2]), cands)
    tokens, lengths = b.get_packed_output_d2h(predict, accept)
    assert torch.equal(tokens, predict) and torch.equal(lengths, accept)
    for other in (predict[::2], predict.view(torch.float32), predict[1:], predict.view(2, 2)):
        assert b.get_packed_output_d2h(other, accept) is None
    with pytest.raises(TypeError, match="output_tokens"):
        b.get_packed_output_d2h(None, accept)


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
@pytest.mark.parametrize("layout", ["sparse", "sparse_csr"])
def test_sparse_tensors_are_refused_by_name(layout):
    def sparse(t):
        return t.to_sparse() if layout == "sparse" else t.to_sparse_csr()

    b = ts.create_backend("gumbel_full", make_config())
    b.prepare_step(["a"], [1], [sp()], num_tokens_per_req=2)
    with pytest.raises(TypeError, match="next_token_logits must be a dense"):
        b.verify(ts.LogitsProcessorOutput(sparse(torch.randn(2, VOCAB))), batch_info([1]),
                 torch.zeros(1, 2, dtype=torch.int32))
    with pytest.raises(TypeError, match="candidates must be a dense"):
        b.verify(ts.LogitsProcessorOutput(torch.randn(2, VOCAB)), batch_info([1]),
                 sparse(torch.zeros(1, 2, dtype=torch.int32)))
    if layout == "sparse":  # CSR is 2-D only: these 1-D arguments are refused by shape
        info = batch_info([1])
        info.req_pool_indices = info.req_pool_indices.to_sparse()
        with pytest.raises(TypeError, match="req_pool_indices must be a dense"):
            b.verify(ts.LogitsProcessorOutput(torch.randn(2, VOCAB)), info,
                     torch.zeros(1, 2, dtype=torch.int32))
        fresh = ts.create_backend("gumbel_full", make_config())
        with pytest.raises(TypeError, match=r"prompt_token_ids\[0\] must be a dense"):
            fresh.prepare_step(["a"], [1], [sp()],
                               prompt_token_ids=[torch.tensor([1, 2]).to_sparse()])


def test_prompt_tensors_of_other_kinds_are_refused_by_name():
    b = ts.create_backend("gumbel_full", make_config())
    with pytest.raises(TypeError, match=r"prompt_token_ids\[0\] must be a 1-D integer"):
        b.prepare_step(["a"], [1], [sp()], prompt_token_ids=[torch.tensor([1 + 2j])])
    with pytest.raises(ValueError, match=r"prompt_token_ids\[0\] is a meta tensor"):
        b.prepare_step(["a"], [1], [sp()], prompt_token_ids=[torch.tensor([1, 2], device="meta")])


@pytest.mark.parametrize("vocab", [torch.tensor([VOCAB, VOCAB]), float(VOCAB), "1024"])
def test_batch_vocab_size_must_be_an_int(vocab):
    b = ts.create_backend("gumbel", make_config())
    b.prepare_step(["a"], [1], [sp()])
    info = batch_info([1])
    info.vocab_size = vocab
    with pytest.raises(TypeError, match="sampling_info.vocab_size"):
        b.sample(ts.LogitsProcessorOutput(torch.randn(1, VOCAB)), info)


@pytest.mark.parametrize("name", ["greedy", "gumbel", "gumbel_full"])
def test_capture_shapes_are_checked(name):
    b = ts.create_backend(name, make_config())
    with pytest.raises(TypeError, match="num_tokens_per_req"):
        b.cuda_graph_capture_variants("x")
    with pytest.raises(ValueError, match="num_tokens_per_req=99"):
        b.cuda_graph_replay_variant(99)
    with pytest.raises(ValueError, match="bs=-5"):
        b.prepare_capture_variant(-5, 1, "default")
    with pytest.raises(ValueError, match="bs=5"):
        b.prepare_capture(5)
    with pytest.raises(ValueError, match="Unsupported CUDA graph variant"):
        b.prepare_capture_variant(1, 1, "nonsense")
    for variant in b.cuda_graph_capture_variants(2):
        b.prepare_capture_variant(4, 2, variant)


@pytest.mark.parametrize("fields,match", [
    (dict(tp_group=5), (TypeError, "tp_group=5")),
    (dict(tp_group=[0, 0]), (ValueError, "distinct")),
    (dict(enable_output_logprobs="no"), (TypeError, "enable_output_logprobs")),
    (dict(enable_tp_sync=1), (TypeError, "enable_tp_sync")),
    (dict(enable_nan_detection=None), (TypeError, "enable_nan_detection")),
])
def test_config_fields_are_typed(fields, match):
    with pytest.raises(match[0], match=match[1]):
        ts.create_backend("gumbel", make_config(**fields))


def test_create_backend_names_a_missing_config():
    with pytest.raises(TypeError, match="config must be a SamplingBackendConfig"):
        ts.create_backend("gumbel", None)


def test_request_ids_must_be_text_and_bias_keys_short():
    b = ts.create_backend("gumbel_full", make_config())
    with pytest.raises(ValueError, match=r"request_ids\[0\]"):
        b.prepare_step(["\ud800"], [1], [ts.SamplingParams()])
    with pytest.raises(ValueError, match="logit_bias key"):
        b.prepare_step(["a"], [1], [sp(logit_bias={"9" * 5000: 1.0})])


def test_a_config_larger_than_the_device_is_refused_before_allocating():
    """A slot table of ~8 TiB (2^20 slots of 2^20-token histories), or top-N outputs of 12 TiB:
    a ValueError naming the fields, before anything is allocated (not an allocator failure
    inside the extension); table_bytes is what is allocated."""
    from tokensampler import _C

    with pytest.raises(ValueError, match=r"slot table \(max_req_pool_size, vocab_size"):
        ts.create_backend("gumbel_full", ts.SamplingBackendConfig(
            max_req_pool_size=2**20 - 1, vocab_size=2**20, penalty_history_capacity=2**20))
    for name in ("greedy", "gumbel"):  # 2^20 rows of 2^20 top-N logprobs: 12 TiB
        with pytest.raises(ValueError, match=r"per-row outputs \(max_bs \* max_draft"):
            ts.create_backend(name, ts.SamplingBackendConfig(
                max_bs=2**16, max_draft_tokens_per_req=16, vocab_size=2**20,
                top_logprobs_num=2**20))
    b = ts.create_backend("gumbel_full", make_config())
    s = b.slots
    assert s.table.numel() * 4 == _C.SlotStateManager.table_bytes(
        s.pool_rows, s.vocab_size, s.history_capacity, s.bias_capacity)


def test_gpu_memory_check_counts_free_memory(monkeypatch):
    """On a GPU the bound is what is still free (an engine builds the sampler beside its weights
    and KV cache) plus what torch's caching allocator holds unused, not the card's total:
    queried here through stand-ins, so the check runs without a GPU."""
    from tokensampler.backends import checks

    gib = 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (2 * gib, 140 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 10 * gib)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 9 * gib)
    cuda = torch.device("cuda", 0)
    checks.check_memory(cuda, {"the slot table": 3 * gib})  # 2 free + 1 cached unused
    with pytest.raises(ValueError, match=r"needs 3\.5 GiB on cuda:0 \(the slot table: 3\.0 GiB, "
                                         r"the workspace: 0\.5 GiB\), more than the 3\.0 GiB it "
                                         r"has free"):
        checks.check_memory(cuda, {"the slot table": 3 * gib, "the workspace": gib // 2})
