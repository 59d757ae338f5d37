"""`wide.Generator.compare`: dense (routing off) against routed greedy generation on the same prompts (CPU)."""

from __future__ import annotations

import pytest
import torch

import wide
from tests.conftest import tiny_model
from wide.modeling.inference import enable_kernels


def _routed(sparsity=0.5, router="lowrank"):
    model = tiny_model("llama")
    wide.apply_wide(model, wide.WideConfig(sparsity=sparsity, router=router, attn_group_size=2, ffn_group_size=32))
    model.eval()
    return enable_kernels(model, "torch")


def _prompts(*lengths):
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, 96, (1, t), generator=g) for t in lengths]


def test_compare_at_zero_sparsity_gives_the_same_tokens_on_both_sides():
    gen = wide.Generator(_routed(0.0, "topk"), batch_size=1, max_cache_len=64, chunk=(8, 4))
    got = gen.compare(_prompts(5, 11), max_new_tokens=9)
    assert len(got.prompts) == 2 and got.new_tokens == 18
    for p in got.prompts:
        assert p.dense.new_tokens == p.routed.new_tokens == 9
        assert p.dense.tokens == p.routed.tokens and p.first_divergence is None and p.matching == 9
        assert p.skipped["total"] == p.skipped["by_weight"] == 0.0
    assert got.matching == 18 and got.device == "cpu" and got.dtype == "float32" and not got.graphs


def test_compare_times_the_dense_backbone_against_the_routed_model():
    model = _routed()
    plain = tiny_model("llama")  # the same seed: the backbone's weights, never routed
    prompts = _prompts(6, 13)
    gen = wide.Generator(model, batch_size=1, max_cache_len=64, chunk=(8, 4))
    got = gen.compare(prompts, max_new_tokens=7)
    for ids, p in zip(prompts, got.prompts):
        n = ids.shape[1]
        assert p.prompt_tokens == n and p.dense.new_tokens == p.routed.new_tokens == 7
        assert p.dense.tokens[0] == wide.generate(plain, ids, max_new_tokens=7)[0, n:].tolist()
        assert p.routed.tokens[0] == wide.generate(model, ids, max_new_tokens=7)[0, n:].tolist()
        assert p.dense.tokens_per_s > 0 and p.routed.tokens_per_s > 0 and p.ratio > 0
        assert set(p.skipped) == {"attn", "ffn", "total", "by_weight"} and 0 < p.skipped["by_weight"] < 1
        assert p.skipped["total"] == pytest.approx((p.skipped["attn"] + p.skipped["ffn"]) / 2)
        first = p.first_divergence
        assert p.matching <= 7 and (first is None) == (p.matching == 7)
        if first is not None:
            assert p.dense.tokens[0][:first] == p.routed.tokens[0][:first]
    d = got.to_dict()
    assert [q["routed"]["tokens"] for q in d["prompts"]] == [p.routed.tokens for p in got.prompts]
    total = d["total"]
    assert total["new_tokens"] == 14 and total["ratio"] == pytest.approx(
        total["routed_tokens_per_s"] / total["dense_tokens_per_s"])
    assert 0 < total["skipped"]["by_weight"] < 1
    again = gen.compare(prompts, max_new_tokens=7, warmup=False)  # the dense twin and its cache are kept
    assert [p.dense.tokens for p in again.prompts] == [p.dense.tokens for p in got.prompts]
    assert gen._dense_twin() is gen._dense_twin()


@pytest.mark.parametrize("prompts, field", [
    ([], "prompts"),
    (torch.ones(1, 3, dtype=torch.long), "prompts"),
    ([torch.ones(2, 3, dtype=torch.long)], "prompts"),
    ([torch.ones(1, 3)], "input_ids"),
    ([torch.ones(1, 60, dtype=torch.long)], "max_cache_len"),
], ids=["empty", "a tensor", "rows", "dtype", "too long"])
def test_compare_bad_prompts_name_the_field(prompts, field):
    gen = wide.Generator(_routed(), batch_size=1, max_cache_len=64)
    with pytest.raises(ValueError, match=field):
        gen.compare(prompts, max_new_tokens=8)


def test_compare_needs_a_routed_model():
    gen = wide.Generator(tiny_model("llama"), batch_size=1, max_cache_len=32)
    with pytest.raises(ValueError, match="model: not routed"):
        gen.compare(_prompts(4), max_new_tokens=3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_compare_on_cuda_replays_graphs_on_both_sides():
    cfg = wide.WideConfig(sparsity=0.5, router="lowrank", attn_group_size=2, ffn_group_size=32)
    model = enable_kernels(wide.apply_wide(tiny_model("llama").cuda(), cfg).eval(), "triton")
    plain = tiny_model("llama").cuda()
    prompts = [p.cuda() for p in _prompts(6, 13)]
    prompts.append(prompts[0].clone())  # a repeated prompt: the replayed graphs must give the same tokens
    sizes = dict(batch_size=1, max_cache_len=64, chunk=(8, 4))
    got = wide.Generator(model, **sizes).compare(prompts, max_new_tokens=10)
    assert got.graphs and got.device.startswith("cuda")
    dense, routed = wide.Generator(plain, **sizes), wide.Generator(model, **sizes)
    for ids, p in zip(prompts, got.prompts):
        n = ids.shape[1]
        assert p.dense.tokens[0] == dense.generate(ids, max_new_tokens=10)[0, n:].tolist()
        assert p.routed.tokens[0] == routed.generate(ids, max_new_tokens=10)[0, n:].tolist()
    assert got.prompts[0].routed.tokens == got.prompts[2].routed.tokens  # a repeated prompt: graphs replayed
