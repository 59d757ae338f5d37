"""``fuse_glue``: RMS norms, RoPE and dense MLP glue compiled in place, same outputs, CUDA-graph capturable.

CPU in CI with the ``aot_eager`` backend (the same full graphs, no generated code: CI needs no C++ compiler);
GPU with inductor (Triton kernels, a CUDA graph of a fused routed decode step) on the device:
``pytest -m gpu tests/modeling/test_fuse.py``.
"""

from __future__ import annotations

import sys

import pytest
import torch
from transformers import DynamicCache, StaticCache

import wide
from tests.conftest import tiny_model
from tests.modeling.graph_step import eager_and_replayed_step
from wide.modeling.fuse import fuse_glue, unfuse_glue
from wide.modeling.inference import enable_kernels

CPU_BACKEND = "aot_eager"


def _logits(model, rows: int = 2, static: bool = False):
    """Logits of a 7-token prefill and two cached decode steps."""
    dev = next(model.parameters()).device
    cache = StaticCache(config=model.config, max_cache_len=16) if static else DynamicCache(config=model.config)
    prompt = torch.arange(3, 3 + 7 * rows, device=dev).view(rows, 7) % model.config.vocab_size
    with torch.inference_mode():
        out = [model(input_ids=prompt, past_key_values=cache, use_cache=True).logits]
        for i in range(2):
            tok = torch.arange(5 + i, 5 + i + rows, device=dev).view(rows, 1)
            out.append(model(input_ids=tok, past_key_values=cache, use_cache=True,
                             cache_position=torch.tensor([7 + i], device=dev)).logits)
    return out


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("arch_name", ["llama", "qwen3"])
def test_fused_dense_model_gives_the_same_logits_and_unfuses(arch_name):
    model = tiny_model(arch_name, num_hidden_layers=2)
    ref = _logits(model)
    counts = fuse_glue(model, CPU_BACKEND)
    # qwen3 also norms q and k per head
    norms = 2 * 2 + 1 + (2 * 2 if arch_name == "qwen3" else 0)
    assert counts == {"norm": norms, "rope": 2, "mlp": 2}
    assert fuse_glue(model, CPU_BACKEND) == counts  # idempotent: nothing is compiled twice
    rope_module = sys.modules[type(model.model.layers[0].self_attn).__module__]
    assert hasattr(rope_module.apply_rotary_pos_emb, "_wide_original")
    for a, b in zip(ref, _logits(model)):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    unfuse_glue(model)
    assert not hasattr(rope_module.apply_rotary_pos_emb, "_wide_original")
    assert "forward" not in vars(model.model.norm)
    for a, b in zip(ref, _logits(model)):
        torch.testing.assert_close(b, a)


def test_one_fused_norm_serves_more_shapes_than_dynamos_default_recompile_limit():
    # every layer's norm runs one compiled function; batch and length 1 vs > 1 and each dtype are separate
    # specialisations (12 here), past torch's default limit of 8 (a hard failure under fullgraph=True)
    model = tiny_model("llama", num_hidden_layers=1)
    fuse_glue(model, CPU_BACKEND)
    norm = model.model.norm
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for b, t in ((1, 1), (1, 5), (3, 1), (3, 5)):
            x = torch.randn(b, t, model.config.hidden_size).to(dtype)
            with torch.inference_mode():
                torch.testing.assert_close(norm(x), type(norm).forward(norm, x))


def test_fused_routed_model_matches_unfused_per_token_and_coherent():
    """Fused before routing (as ``wide bench --fuse-glue`` does) and with routed kernels on: the routed MLP
    replaces the fused dense one; norms and RoPE stay fused; same logits over a static cache."""
    model = tiny_model("llama", num_hidden_layers=2)
    wide.apply_wide(model, wide.WideConfig(sparsity=0.5, router="lowrank", attn_group_size=2, ffn_group_size=32))
    model.eval()
    enable_kernels(model, "torch")
    refs = {}
    for coherent in (None, 1):
        wide.set_coherent_decode(model, coherent)
        refs[coherent] = _logits(model, static=True)
    counts = fuse_glue(model, CPU_BACKEND)
    assert counts == {"norm": 5, "rope": 2, "mlp": 0}
    try:
        for coherent in (None, 1):
            wide.set_coherent_decode(model, coherent)
            for a, b in zip(refs[coherent], _logits(model, static=True)):
                torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    finally:
        unfuse_glue(model)


def test_routed_reference_mlp_glue_is_fused():
    """Without kernels a routed SiLU MLP runs ``silu(gate) ⊙ mask ⊙ up`` as one compiled function: same logits."""
    model = tiny_model("llama", num_hidden_layers=1)
    wide.apply_wide(model, wide.WideConfig(sparsity=0.5, router="lowrank", attn_group_size=2, ffn_group_size=32))
    model.eval()
    ref = _logits(model)
    try:
        assert fuse_glue(model, CPU_BACKEND)["mlp"] == 1
        assert hasattr(model.model.layers[0].mlp.forward, "_wide_original")
        for a, b in zip(ref, _logits(model)):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    finally:
        unfuse_glue(model)
    assert "forward" not in vars(model.model.layers[0].mlp)


def _train_step(model, ids, seed: int):
    """Loss and router gradients of one training forward (hard Gumbel masks, straight-through) + backward."""
    model.zero_grad(set_to_none=True)
    wide.modeling.runtime_of(model).set_noise(seed)
    loss = model(input_ids=ids, labels=ids).loss
    stats = wide.sparsity_stats(model)
    loss = loss + 5.0 * (0.5 - stats.realized(differentiable=True)).abs()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in wide.router_parameters(model)}


@pytest.mark.parametrize("arch_name,checkpointing", [("llama", False), ("qwen2", False), ("llama", True)],
                         ids=["llama", "qwen2", "llama-gradient-checkpointing"])
def test_fused_glue_trains_like_the_eager_glue(arch_name, checkpointing):
    """Training (the reason `WideTask(fuse_glue=...)` exists): fused norms, RoPE and masked SwiGLU give the eager
    loss and the same router gradients, through the masks' straight-through estimator, fp32 on the CPU; also with
    the decoder layers recomputed in backward (`gradient_checkpointing`, as the 8B recipes train)."""
    model = tiny_model(arch_name, num_hidden_layers=2)
    wide.apply_wide(model, wide.WideConfig(sparsity=0.5, router="lowrank", attn_group_size=2, ffn_group_size=32))
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    ids = torch.randint(3, model.config.vocab_size, (2, 12))
    ref_loss, ref_grads = _train_step(model, ids, seed=7)
    assert all(g.abs().sum() > 0 for g in ref_grads.values())
    counts = fuse_glue(model, CPU_BACKEND)
    assert counts["mlp"] == 2 and counts["norm"] == 5 and counts["rope"] == 2
    try:
        loss, grads = _train_step(model, ids, seed=7)
        torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
        for name, g in ref_grads.items():
            torch.testing.assert_close(grads[name], g, rtol=1e-4, atol=1e-6, msg=name)
    finally:
        unfuse_glue(model)


def test_load_fuse_glue_generates_the_same_tokens(tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    wide.apply_wide(model, wide.WideConfig(sparsity=0.5, attn_group_size=2, ffn_group_size=32))
    wide.export(model, tmp_path / "exported")
    ids = torch.randint(3, 96, (2, 8))
    plain = wide.load(tmp_path / "exported")
    expect = plain.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=5, do_sample=False)
    fused = wide.load(tmp_path / "exported", fuse_glue=CPU_BACKEND)
    try:
        assert hasattr(fused.model.norm.forward, "_wide_original")
        got = fused.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=5, do_sample=False)
        torch.testing.assert_close(got, expect)
    finally:
        unfuse_glue(fused)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_inductor_glue_trains_like_the_eager_glue_on_the_gpu():
    """Inductor's Triton kernels for the training glue, bf16 backbone under autocast (how `wide fit` trains on a
    GPU): the loss and router gradients of the eager glue, to bf16 rounding."""
    model = tiny_model("llama", num_hidden_layers=2, hidden_size=256, intermediate_size=512, num_attention_heads=8,
                       num_key_value_heads=2).to("cuda", torch.bfloat16)
    wide.apply_wide(model, wide.WideConfig(sparsity=0.5, router="lowrank", attn_group_size=4, ffn_group_size=128))
    model.train()
    ids = torch.randint(3, model.config.vocab_size, (4, 64), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        ref_loss, ref_grads = _train_step(model, ids, seed=3)
    fuse_glue(model)
    try:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss, grads = _train_step(model, ids, seed=3)
        torch.testing.assert_close(loss.float(), ref_loss.float(), rtol=2e-2, atol=2e-2)
        for name, g in ref_grads.items():
            cos = torch.nn.functional.cosine_similarity(grads[name].flatten().float(), g.flatten().float(), dim=0)
            assert cos > 0.98, (name, float(cos))
    finally:
        unfuse_glue(model)


@pytest.mark.parametrize("coherent", [False, True], ids=["per-token", "coherent"])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_routed_decode_replays_from_a_cuda_graph(coherent):
    """Triton backend, glue fused: same logits as unfused; a decode step captured in a CUDA graph (after
    eager warm-ups at its shape) replays them."""
    model = tiny_model("llama", num_hidden_layers=3, hidden_size=256, intermediate_size=512,
                       num_attention_heads=8, num_key_value_heads=2).to("cuda", torch.float16)
    wide.apply_wide(model, wide.WideConfig(sparsity=0.5, router="lowrank", attn_group_size=4, ffn_group_size=128))
    model.eval()
    enable_kernels(model, "triton")
    wide.set_coherent_decode(model, 1 if coherent else None)
    ref = _logits(model, static=True)
    fuse_glue(model)
    try:
        got = _logits(model, static=True)
        for a, b in zip(ref, got):
            torch.testing.assert_close(b.float(), a.float(), rtol=2e-2, atol=2e-2)
        cache = StaticCache(config=model.config, max_cache_len=16)
        prompt = torch.arange(3, 17, device="cuda").view(2, 7)
        with torch.inference_mode():
            model(input_ids=prompt, past_key_values=cache, use_cache=True)
            expect, static = eager_and_replayed_step(model, cache, torch.tensor([[11], [13]], device="cuda"), 7,
                                                     warmups=2)
        torch.testing.assert_close(static.float(), expect.float(), rtol=2e-2, atol=2e-2)
    finally:
        unfuse_glue(model)
