"""``wide.generate``: greedy decoding over a static cache, steps replayed from a CUDA graph on GPUs.

CPU: the eager loop gives HF ``generate``'s greedy tokens (routed and dense) and rejects bad input before any
compute. GPU (``pytest -m gpu tests/modeling/test_generate.py``): the graph-replayed loop gives the eager loop's
tokens with the Triton kernels, per-token and batch-coherent.
"""

from __future__ import annotations

import pytest
import torch

import wide
from tests.conftest import tiny_model
from wide.modeling.inference import enable_kernels


def _routed(device="cpu", dtype=torch.float32, backend="torch", **sizes):
    model = tiny_model("llama", **sizes).to(device, dtype)
    wide.apply_wide(model, wide.WideConfig(sparsity=0.5, router="lowrank", attn_group_size=2, ffn_group_size=32))
    model.eval()
    enable_kernels(model, backend)
    return model


def _hf_greedy(model, ids, n, **kw):
    mask = torch.ones_like(ids)
    return model.generate(ids, attention_mask=mask, max_new_tokens=n, do_sample=False, **kw)


@pytest.mark.parametrize("routed", [True, False], ids=["routed", "dense"])
def test_eager_loop_gives_hf_greedy_tokens(routed):
    model = _routed() if routed else tiny_model("llama").eval()
    ids = torch.randint(3, 96, (3, 7), generator=torch.Generator().manual_seed(0))
    got = wide.generate(model, ids, max_new_tokens=9)
    assert got.shape == (3, 16) and torch.equal(got[:, :7], ids)
    torch.testing.assert_close(got, _hf_greedy(model, ids, 9, min_new_tokens=9))


def test_eos_pads_finished_rows_and_stops_when_all_finish():
    model = _routed()
    ids = torch.randint(3, 96, (2, 5), generator=torch.Generator().manual_seed(1))
    free = wide.generate(model, ids, max_new_tokens=12)
    eos = int(free[0, 5 + 2])  # row 0's third new token
    got = wide.generate(model, ids, max_new_tokens=12, eos_token_id=eos, pad_token_id=0, check_every=1)
    row0 = got[0, 5:]
    first = int((row0 == eos).nonzero()[0])
    assert first <= 2 and (row0[first + 1:] == 0).all()
    for r in range(2):  # up to each row's first EOS the tokens are the free-running ones
        hit = (free[r, 5:] == eos).nonzero()
        end = int(hit[0]) + 1 if len(hit) else got.shape[1] - 5
        assert torch.equal(got[r, 5:5 + end], free[r, 5:5 + end])
    if not (free[1, 5:] == eos).any():
        assert got.shape[1] == 17  # row 1 never finishes: all 12 tokens
    one = wide.generate(model, ids[:1], max_new_tokens=12, eos_token_id=eos, check_every=1)
    assert one.shape[1] < 17 and one[0, -1] == eos  # the only row finished: the loop stopped there


def test_any_of_several_stop_ids_finishes_a_row():
    """A chat model ends its turn with its own token beside the tokenizer's EOS (Qwen2.5: ``<|im_end|>``, then
    ``<|endoftext|>``): with the list, each row stops at whichever it emits first and the loop ends when all did."""
    from wide.modeling.generate import cut_at_stop

    model = _routed()
    ids = torch.randint(3, 96, (2, 5), generator=torch.Generator().manual_seed(1))
    free = wide.generate(model, ids, max_new_tokens=12)
    stops = [int(free[0, 5 + 2]), int(free[1, 5 + 3])]  # row 0's third new token, row 1's fourth
    got = wide.generate(model, ids, max_new_tokens=12, eos_token_id=stops, pad_token_id=0, check_every=1)
    assert got.shape[1] < 17  # both rows finished: the loop stopped before 12 new tokens
    for r in range(2):
        row = got[r, 5:].tolist()
        kept = cut_at_stop(free[r, 5:].tolist(), stops)
        assert row[:len(kept)] == kept and kept[-1] in stops and set(row[len(kept):]) <= {0}
    first_only = wide.generate(model, ids, max_new_tokens=12, eos_token_id=stops[:1], check_every=1)
    assert first_only.shape[1] >= got.shape[1]


def test_stop_token_ids_take_the_tokenizer_eos_then_the_models():
    from types import SimpleNamespace

    from wide.modeling.generate import cut_at_stop, stop_token_ids

    tok = SimpleNamespace(eos_token_id=151643)
    chat = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=[151645, 151643]))
    assert stop_token_ids(tok, chat) == [151643, 151645]
    assert stop_token_ids(tok, SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=7))) == [151643, 7]
    assert stop_token_ids(SimpleNamespace(eos_token_id=None), None) == []
    assert cut_at_stop([5, 6, 7, 8], [7, 9]) == [5, 6, 7] and cut_at_stop([5, 6], [7]) == [5, 6]


@pytest.mark.parametrize("kwargs, field", [
    (dict(input_ids=torch.ones(2, 3)), "input_ids"),
    (dict(input_ids=torch.ones(5, dtype=torch.long)), "input_ids"),
    (dict(input_ids=torch.full((1, 3), 10**6, dtype=torch.long)), "input_ids"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(eos_token_id=-1), "eos_token_id"),
    (dict(eos_token_id=[]), "eos_token_id"),
    (dict(eos_token_id=[1, 10**6]), "eos_token_id"),
    (dict(max_cache_len=4), "max_cache_len"),
    (dict(graphs=True), "graphs"),
    (dict(check_every=0), "check_every"),
])
def test_bad_input_names_the_field(kwargs, field):
    model = _routed()
    args = dict(input_ids=torch.ones(1, 3, dtype=torch.long), max_new_tokens=4)
    args.update(kwargs)
    with pytest.raises(ValueError, match=field):
        wide.generate(model, **args)


def test_enable_kernels_turns_off_hf_auto_compile():
    model = tiny_model("llama")
    assert not model.generation_config.disable_compile
    wide.apply_wide(model, wide.WideConfig(sparsity=0.5, attn_group_size=2, ffn_group_size=32))
    enable_kernels(model, "torch")
    assert model.generation_config.disable_compile


def test_training_mode_is_refused():
    model = _routed().train()
    with pytest.raises(ValueError, match="eval"):
        wide.generate(model, torch.ones(1, 3, dtype=torch.long), max_new_tokens=2)


@pytest.mark.parametrize("fused", [False, True], ids=["separate-launches", "decode_qkv"])
@pytest.mark.parametrize("coherent", [False, True], ids=["per-token", "coherent"])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_side_stream_attention_routing_gives_the_one_stream_tokens(coherent, fused, monkeypatch):
    """Decode steps that decide the attention mask on a side stream while K/V run (the default on CUDA) give
    the tokens of one stream, eagerly and replayed from a CUDA graph (which captures the fork and join). With the
    separate launches K and V run ahead as their own GEMMs; with `decode_qkv` (the default) inside the fused launch,
    which then computes every q head."""
    from tests.modeling.test_fused_attention import UNFUSED
    from wide.kernels import use_kernel_options
    from wide.modeling.inference import EarlyLinear

    model = _routed("cuda", torch.float32, "triton", num_hidden_layers=3, hidden_size=256, intermediate_size=512,
                    num_attention_heads=8, num_key_value_heads=2)
    wide.set_coherent_decode(model, 1 if coherent else None)
    ids = torch.randint(3, 96, (4, 9), generator=torch.Generator().manual_seed(3)).cuda()
    early = []
    real = EarlyLinear.run_early
    # (one entry per early K / V GEMM: whether it belonged to a decode step)
    monkeypatch.setattr(EarlyLinear, "run_early", lambda self, x: early.append(x.shape[-2] == 1) or real(self, x))
    with use_kernel_options(**({} if fused else UNFUSED)):
        overlapped = [wide.generate(model, ids, max_new_tokens=20, graphs=g) for g in (False, True)]
        if fused:
            assert not any(early), "a decode step's K and V run inside the fused launch"
        else:
            assert sum(early) >= 2 * 3 * 19  # K and V of every layer ran ahead in the eager decode steps
        wide.set_overlap_routing(model, False)
        early.clear()
        one_stream = wide.generate(model, ids, max_new_tokens=20, graphs=True)
    assert not early
    for got in overlapped:
        assert torch.equal(got, one_stream)


def _chunk_calls(monkeypatch):
    """Records the ``q_offset`` of every routed prefill attention call (``None``: a whole prompt)."""
    from wide import kernels

    calls = []
    real = kernels.attention_prefill
    monkeypatch.setattr(kernels, "attention_prefill",
                        lambda *a, **k: calls.append(k.get("q_offset")) or real(*a, **k))
    return calls


def test_prompt_chunks_over_a_static_cache_take_the_routed_kernel(monkeypatch):
    """Chunks at positions [p, p + t) of a static cache get HF's 4D causal masks: the routed attention reads the
    chunk's position from the mask (``q_offset``) instead of falling back, and the logits are the whole prompt's."""
    from transformers import StaticCache

    model = _routed()
    ids = torch.randint(3, 96, (2, 13), generator=torch.Generator().manual_seed(4))
    whole = model(input_ids=ids, use_cache=False).logits
    calls = _chunk_calls(monkeypatch)
    cache = StaticCache(config=model.config, max_cache_len=20)
    parts = [model(input_ids=ids[:, p:p + t], past_key_values=cache, use_cache=True,
                   cache_position=torch.arange(p, p + t)).logits for p, t in ((0, 5), (5, 5), (10, 3))]
    torch.testing.assert_close(torch.cat(parts, 1), whole, atol=1e-5, rtol=1e-5)
    layers = model.config.num_hidden_layers
    assert len(calls) == 3 * layers and all(o is not None for o in calls[layers:])
    assert [int(o[0]) for o in calls[layers::layers]] == [5, 10]
    # the first chunk: a 4D mask or none at all (transformers may hand sdpa's is_causal an empty cache's prefix)
    assert all(o is None or int(o[0]) == 0 for o in calls[:layers])


def test_a_mask_that_is_not_plain_causal_takes_the_reference_path(monkeypatch):
    """A prompt chunk whose 4D mask hides more than the causal future (here: one cached key) is not a chunk the
    kernels can read positions from: the reference path runs it, and the logits follow the mask."""
    from transformers import DynamicCache

    model = _routed()
    ids = torch.randint(3, 96, (1, 8), generator=torch.Generator().manual_seed(5))
    cache = DynamicCache(config=model.config)
    model(input_ids=ids[:, :5], past_key_values=cache, use_cache=True)
    mask = torch.ones(1, 1, 3, 8, dtype=torch.bool).tril(5)
    mask[..., 1] = False
    calls = _chunk_calls(monkeypatch)
    model(input_ids=ids[:, 5:], past_key_values=cache, use_cache=True, attention_mask=mask,
          cache_position=torch.arange(5, 8))
    assert calls == []


@pytest.mark.parametrize("chunk", [1, 3, 7, 64, (8, 4, 2)], ids=lambda c: f"chunk{c}")
def test_generator_gives_generate_tokens_across_calls(chunk):
    """One `Generator` (one static cache) over calls with prompts of other lengths: the tokens of `wide.generate`
    every time, with the filler keys of a short last chunk and earlier calls' keys left in the cache."""
    model = _routed()
    gen = wide.Generator(model, batch_size=2, max_cache_len=64, chunk=chunk)
    g = torch.Generator().manual_seed(6)
    for t, n in ((9, 6), (4, 9), (13, 3), (1, 5)):
        ids = torch.randint(3, 96, (2, t), generator=g)
        torch.testing.assert_close(gen.generate(ids, max_new_tokens=n), wide.generate(model, ids, max_new_tokens=n))


def test_generator_plans_full_chunks_then_the_smallest_that_holds_the_rest():
    gen = wide.Generator(_routed(), batch_size=1, max_cache_len=64, chunk=(4, 16, 8), whole_from=40)
    assert gen.plan(35) == [16, 16, 4] and gen.plan(16) == [16] and gen.plan(3) == [4] and gen.plan(21) == [16, 8]
    assert gen.plan(40) == [] and wide.Generator(_routed(), batch_size=1, max_cache_len=8, chunk=None).plan(5) == []


def test_generator_whole_from_default_chunks_routed_models_always_and_dense_ones_below_2048():
    assert wide.Generator(_routed(), batch_size=1, max_cache_len=64).whole_from is None
    dense = tiny_model("llama").eval()
    gen = wide.Generator(dense, batch_size=1, max_cache_len=4096)
    assert gen.whole_from == 2048 and gen.plan(2047) == [1024, 1024] and gen.plan(2048) == []
    with pytest.raises(ValueError, match="whole_from"):
        wide.Generator(dense, batch_size=1, max_cache_len=64, whole_from="always")


def test_generator_plans_within_the_cache_and_keeps_the_tokens():
    """A filled-up last chunk never overruns the cache: the rest is cut smaller, or the prompt runs whole."""
    model = _routed()
    gen = wide.Generator(model, batch_size=1, max_cache_len=30, chunk=(16, 8, 4))
    assert gen.plan(20) == [16, 4] and gen.plan(21) == [16, 8]  # room for the filled-up chunk
    assert gen.plan(27) == [16, 8, 4]  # [16, 16] would need 32 positions: the rest of 11 as 8 + a filled-up 4
    assert gen.plan(29) == []  # 16 + 8 + 4 leaves 1 token that no chunk fits in the 2 positions left
    tight = wide.Generator(model, batch_size=1, max_cache_len=27, chunk=(16, 8))
    assert tight.plan(23) == [16, 8] and tight.plan(25) == []  # 16 + 8 + a filled-up 8 would need 32 positions
    g = torch.Generator().manual_seed(4)
    for gen_, t in ((gen, 27), (gen, 29), (tight, 25), (tight, 23)):
        ids = torch.randint(3, 96, (1, t), generator=g)
        n = gen_.max_cache_len - t
        torch.testing.assert_close(gen_.generate(ids, max_new_tokens=n), wide.generate(model, ids, max_new_tokens=n))


def test_generator_runs_long_prompts_as_one_forward_with_the_same_tokens(monkeypatch):
    model = _routed()
    gen = wide.Generator(model, batch_size=2, max_cache_len=64, chunk=4, whole_from=10)
    calls = _chunk_calls(monkeypatch)
    ids = torch.randint(3, 96, (2, 12), generator=torch.Generator().manual_seed(9))
    torch.testing.assert_close(gen.generate(ids, max_new_tokens=5), wide.generate(model, ids, max_new_tokens=5))
    assert len(calls) == 2 * model.config.num_hidden_layers  # one prefill forward (each call's), no chunks


def test_generator_coherent_decode_restarts_its_schedule_each_call():
    model = _routed()
    wide.set_coherent_decode(model, 3)
    gen = wide.Generator(model, batch_size=3, max_cache_len=40, chunk=4)
    g = torch.Generator().manual_seed(7)
    for t in (6, 10):
        ids = torch.randint(3, 96, (3, t), generator=g)
        torch.testing.assert_close(gen.generate(ids, max_new_tokens=8), wide.generate(model, ids, max_new_tokens=8))


@pytest.mark.parametrize("kwargs, field", [
    (dict(batch_size=0), "batch_size"),
    (dict(max_cache_len=0), "max_cache_len"),
    (dict(chunk=0), "chunk"),
    (dict(chunk=65), "chunk"),
    (dict(chunk=(8, 0)), "chunk"),
    (dict(chunk=()), "chunk"),
    (dict(whole_from=0), "whole_from"),
    (dict(graphs=True), "graphs"),
])
def test_generator_bad_arguments_name_the_field(kwargs, field):
    args = dict(batch_size=1, max_cache_len=64, chunk=8)
    args.update(kwargs)
    with pytest.raises(ValueError, match=field):
        wide.Generator(_routed(), **args)


def test_generator_bad_calls_name_the_field():
    model = _routed()
    gen = wide.Generator(model, batch_size=2, max_cache_len=12, chunk=8)
    with pytest.raises(ValueError, match="input_ids"):
        gen.generate(torch.ones(1, 3, dtype=torch.long), max_new_tokens=2)
    with pytest.raises(ValueError, match="max_cache_len"):
        gen.generate(torch.ones(2, 9, dtype=torch.long), max_new_tokens=4)
    wide.set_coherent_decode(model, 1, memory=0.5)
    with pytest.raises(ValueError, match="memory"):
        wide.Generator(model, batch_size=1, max_cache_len=12, chunk=8)


@pytest.mark.parametrize("coherent", [False, True], ids=["per-token", "coherent"])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_generator_graphs_give_the_eager_tokens_across_calls(coherent, monkeypatch):
    """Captured once (a prompt chunk and a decode step), replayed in later calls: the eager loop's tokens, with the
    routed chunk attention inside the captured chunk."""
    model = _routed("cuda", torch.float32, "triton", num_hidden_layers=3, hidden_size=256, intermediate_size=512,
                    num_attention_heads=8, num_key_value_heads=2)
    wide.set_coherent_decode(model, 2 if coherent else None)
    replayed = wide.Generator(model, batch_size=4, max_cache_len=96, chunk=16)
    eager = wide.Generator(model, batch_size=4, max_cache_len=96, chunk=16, graphs=False)
    calls = _chunk_calls(monkeypatch)
    g = torch.Generator().manual_seed(8)
    for t, n in ((37, 20), (9, 12), (50, 30)):
        ids = torch.randint(3, 96, (4, t), generator=g).cuda()
        torch.testing.assert_close(replayed.generate(ids, max_new_tokens=n), eager.generate(ids, max_new_tokens=n))
    assert replayed._chunks[16].graph is not None and replayed._step_graph is not None
    # chunks after a prompt's first read their position from the mask (the first may see no mask when eager)
    assert sum(o is not None for o in calls) >= len(calls) // 2


def test_generate_many_stops_each_batch_on_any_stop_id():
    """`wide data generate` and the generative metrics batch through `generate_many`: every stop id reaches the
    loop (on the first alone, Qwen's chat answers, which end with the second, ran to ``max_new_tokens``)."""
    from wide.modeling.batched import generate_many

    model = _routed()
    prompts = [[5, 6, 7, 8], [9, 10, 11, 12]]
    free = generate_many(model, prompts, max_new_tokens=10)
    stops = [free[0][1], free[1][2]]
    seen = []
    real = wide.Generator.generate

    def spy(self, *args, **kwargs):
        seen.append(kwargs.get("eos_token_id"))
        return real(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(wide.Generator, "generate", spy)
        got = generate_many(model, prompts, max_new_tokens=10, stop_ids=stops)
    assert seen == [stops]
    for row, full in zip(got, free):  # each answer ends before its first stop token
        cut = next(i for i, t in enumerate(full) if t in stops)
        assert row == full[:cut]
