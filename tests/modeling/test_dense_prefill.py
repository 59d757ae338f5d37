"""``prefill="dense"``: the prompt with routing off (the dense model's cache and first token), only the decode steps
routed, through `wide.generate`, `wide.Generator`, `generate_many` and the generative metrics."""

from __future__ import annotations

import pytest
import torch

import wide
from tests.conftest import tiny_model
from wide.eval import generative as G
from wide.eval.meter import SparsityMeter
from wide.modeling.batched import generate_many
from wide.modeling.generate import Generator, cache_kwarg
from wide.modeling.wrap import runtime_of


def _routed(seed: int = 0):
    model = tiny_model("llama", seed=seed)
    return wide.apply_wide(model, wide.WideConfig(router="topk", sparsity=0.5, attn_group_size=2,
                                                  ffn_group_size=32)).eval()


def _prompts(lengths=(6, 3, 6, 9, 4)):
    g = torch.Generator().manual_seed(1)
    return [torch.randint(3, 96, (n,), generator=g).tolist() for n in lengths]


def _reference(model, prompt, n):
    """The plain loop: the prompt with routing off into a dynamic cache, then n greedy routed steps."""
    from transformers import DynamicCache

    kw = {cache_kwarg(model): DynamicCache(config=model.config), "use_cache": True}
    out = []
    with torch.no_grad():
        with runtime_of(model).routing_off():
            logits = model(input_ids=torch.tensor([prompt]), **kw).logits[0, -1]
        for _ in range(n):
            out.append(int(logits.argmax()))
            logits = model(input_ids=torch.tensor([[out[-1]]]), **kw).logits[0, -1]
    return out


def test_dense_prefill_equals_the_plain_loop_one_call_and_chunked():
    model = _routed()
    for p in _prompts():
        want = _reference(model, p, 7)
        assert wide.generate(model, torch.tensor([p]), max_new_tokens=7, prefill="dense")[0, len(p):].tolist() == want
        gen = Generator(model, batch_size=1, max_cache_len=32, chunk=(4, 2), prefill="dense")
        assert gen.generate(torch.tensor([p]), max_new_tokens=7)[0, len(p):].tolist() == want


def test_dense_prefill_gives_the_dense_models_first_token_and_routes_the_rest():
    model = _routed()
    dense = tiny_model("llama")  # the same weights, never routed
    ids = torch.tensor(_prompts()[:1])
    first_dense = wide.generate(dense, ids, max_new_tokens=1)[0, -1]
    assert wide.generate(model, ids, max_new_tokens=1, prefill="dense")[0, -1] == first_dense
    gen = Generator(model, batch_size=1, max_cache_len=32, prefill="dense")
    with torch.inference_mode():
        logits = gen._prompt(ids)
        torch.testing.assert_close(logits, dense(input_ids=ids).logits[:, -1])
        routed_logits = model(input_ids=ids).logits[:, -1]
    assert not torch.allclose(logits, routed_logits)  # the routed prompt would have differed
    out = gen.generate(ids, max_new_tokens=4)
    stats = wide.sparsity_stats(model)  # the last forward was a routed decode step at the target rate
    assert out.shape == (1, ids.shape[1] + 4) and stats.realized().item() == pytest.approx(0.5)


def test_generate_many_dense_prefill_batches_equal_lengths_and_matches_one_at_a_time(monkeypatch):
    from wide.modeling import batched

    model = _routed()
    prompts = _prompts()
    seen, real = [], batched._batches
    monkeypatch.setattr(batched, "_batches", lambda *a: seen.append(a[2]) or real(*a))
    got = generate_many(model, prompts, max_new_tokens=5, batch_size=4, prefill="dense")
    assert seen == [0]  # no prompt token runs through a routed decode step
    assert got == [_reference(model, p, 5) for p in prompts]


def test_bad_prefill_and_tails_with_a_dense_prefill_are_named():
    model = _routed()
    with pytest.raises(ValueError, match="^prefill: must be one of routed, dense"):
        Generator(model, batch_size=1, max_cache_len=8, prefill="sparse")
    with pytest.raises(ValueError, match="^prefill:"):
        generate_many(model, [[3, 4]], max_new_tokens=2, prefill="none")
    gen = Generator(model, batch_size=1, max_cache_len=16, prefill="dense")
    with pytest.raises(ValueError, match="^tails: .*prefill='dense'"):
        gen.generate(torch.tensor([[3, 4]]), max_new_tokens=3, tails=(torch.tensor([[5]]), torch.tensor([1])))


def test_sparsity_pass_with_a_dense_prefill_counts_and_predicts_the_answers_only():
    model = _routed()
    prompts = _prompts((5, 7, 4))
    answers = [_reference(model, p, 4) for p in prompts[:2]] + [[9]]
    meter = SparsityMeter(model)
    preds = G._sparsity_pass(model, meter, prompts, answers, batch_size=2, pad=0, prefill="dense")
    res = meter.result()
    assert res["tokens"] == 3 + 3 + 0  # each answer's tokens but its last: what the decode steps read
    assert res["sparsity"] == pytest.approx(0.5)
    for pred, ans in zip(preds[:2], answers[:2]):
        assert pred.tolist() == ans  # teacher-forced on its own greedy answer: the same tokens
    dense = tiny_model("llama")
    with torch.no_grad():
        assert preds[2].tolist() == [int(dense(input_ids=torch.tensor([prompts[2]])).logits[0, -1].argmax())]
    routed_meter = SparsityMeter(model)
    G._sparsity_pass(model, routed_meter, prompts, answers, batch_size=2, pad=0)
    assert routed_meter.result()["tokens"] == sum(len(p) + len(a) for p, a in zip(prompts, answers))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_dense_prefill_through_graphs_and_triton_kernels_on_the_gpu():
    """Chunk graphs captured with routing off, the decode graph routed (triton kernels): the eager loop's tokens."""
    from wide.modeling.inference import enable_kernels

    model = tiny_model("llama").to("cuda")
    wide.apply_wide(model, wide.WideConfig(attn_group_size=2, ffn_group_size=32)).eval()
    enable_kernels(model, "triton")
    prompts = _prompts((9, 17, 9))
    gen = Generator(model, batch_size=1, max_cache_len=64, chunk=(8, 4), prefill="dense", graphs=True)
    agree = 0
    for p in prompts:
        ids = torch.tensor([p], device="cuda")
        eager = wide.generate(model, ids, max_new_tokens=8, prefill="dense", graphs=False)
        agree += int(torch.equal(gen.generate(ids, max_new_tokens=8), eager))
    assert agree >= len(prompts) - 1  # fp32 kernels: a near-tie may differ between graph and eager shapes


def test_skipped_share_counts_the_routed_tokens_after_a_dense_prompt():
    from wide.modeling.compare import skipped_share

    model = _routed()
    ids = torch.tensor([_prompts()[3]])
    assert skipped_share(model, ids, dense_prompt=4)["total"] == pytest.approx(0.5)  # the topk router's rate
    assert skipped_share(model, ids, dense_prompt=ids.shape[1]) == {"total": 0.0, "by_weight": 0.0}
