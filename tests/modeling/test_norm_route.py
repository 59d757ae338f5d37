"""`KernelOptions.decode_norm_route`: a decode step's RMSNorm output comes with its router's decisions from one
`rms_norm_route` launch (`wide.modeling.normroute`); the tokens are those of the unfused path."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import wide
import wide.kernels
from tests.conftest import tiny_model
from wide.kernels import use_kernel_options
from wide.modeling.inference import enable_kernels, set_kernels
from wide.modeling.normroute import INNER, is_plain_rms_norm

ROOT = Path(__file__).resolve().parents[2]


def _routed(arch="llama", backend="torch", **sizes):
    model = tiny_model(arch, **sizes)
    wide.apply_wide(model, wide.WideConfig(sparsity=0.5, router="lowrank", attn_group_size=2, ffn_group_size=32))
    return enable_kernels(model.eval(), backend)


def _layer_norms(model):
    return [n for layer in model.model.layers for n in (layer.input_layernorm, layer.post_attention_layernorm)]


@pytest.fixture
def spies(monkeypatch):
    """(routed norms' inner forward calls as (norm, tokens), rms_norm_route calls)."""
    inner, fused = [], []
    real = wide.kernels.rms_norm_route

    def route(*a, **k):
        fused.append(a[0].shape)
        return real(*a, **k)

    monkeypatch.setattr(wide.kernels, "rms_norm_route", route)

    def watch(model):
        for norm in _layer_norms(model):
            fwd = getattr(norm, INNER)

            def counted(x, *a, _fwd=fwd, _norm=norm, **k):
                inner.append((_norm, x.shape[1]))
                return _fwd(x, *a, **k)

            setattr(norm, INNER, counted)
        return model

    return watch, inner, fused


def _greedy(model, ids, n=5):
    return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                          do_sample=False)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_decode_steps_skip_the_norm_and_keep_the_tokens(arch, spies):
    watch, inner, fused = spies
    model = watch(_routed(arch))
    ids = torch.randint(3, 96, (3, 6), generator=torch.Generator().manual_seed(0))
    off = _greedy(model, ids)
    assert any(t == 1 for _, t in inner) and not fused
    inner.clear()
    with use_kernel_options(decode_norm_route=True):
        on = _greedy(model, ids)
    assert torch.equal(on, off)
    assert inner and all(t > 1 for _, t in inner), "a decode step ran the norm's own forward"
    assert {n for n, _ in inner} == set(_layer_norms(model)), "the prefill runs every norm itself"
    assert len(fused) == 4 * 2 * model.config.num_hidden_layers and all(s[:2] == (3, 1) for s in fused)
    set_kernels(model, False)  # the reference path: the same tokens
    assert torch.equal(_greedy(model, ids), off)


def test_switch_off_is_bit_identical_to_the_unwrapped_norms():
    model = _routed()
    ids = torch.randint(3, 96, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = model(ids, use_cache=True)
        step = model(ids[:, -1:], past_key_values=out.past_key_values).logits
        for norm in _layer_norms(model):  # take the wrappers off
            del norm.forward
        out2 = model(ids, use_cache=True)
        step2 = model(ids[:, -1:], past_key_values=out2.past_key_values).logits
    assert torch.equal(out.logits, out2.logits) and torch.equal(step, step2)


def test_coherent_decode_forced_masks_and_wide_decode_batches_fall_back(spies):
    watch, inner, fused = spies
    model = watch(_routed())
    ids = torch.randint(3, 96, (2, 6), generator=torch.Generator().manual_seed(2))
    with use_kernel_options(decode_norm_route=True):
        wide.set_coherent_decode(model, refresh_every=1)
        _greedy(model, ids, 3)
        wide.set_coherent_decode(model, None)
        assert not fused and any(t == 1 for _, t in inner)
        inner.clear()
        layer = model.model.layers[1].wide
        layer.forced["ffn"] = torch.ones(2, 1, layer.slots["ffn"].num_groups)
        with torch.no_grad():
            out = model(ids, use_cache=True)
            model(ids[:, -1:], past_key_values=out.past_key_values)
        assert len(fused) == 2 * 2  # layers 0 and 2 only: the forced layer routes as usual
        assert (model.model.layers[1].post_attention_layernorm, 1) in inner
        layer.forced.clear()
        fused.clear()
        with torch.no_grad():
            model(torch.randint(3, 96, (65, 1)))  # 65 rows: not a decode batch of the kernel
        assert not fused


def test_training_mode_and_gemma_norms_do_not_fuse():
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    assert is_plain_rms_norm(LlamaRMSNorm(8)) and not is_plain_rms_norm(Gemma3RMSNorm(8))
    model = _routed()
    model.train()
    ids = torch.randint(3, 96, (2, 1))
    calls = []
    real = wide.kernels.rms_norm_route
    try:
        wide.kernels.rms_norm_route = lambda *a, **k: calls.append(1) or real(*a, **k)
        with use_kernel_options(decode_norm_route=True):
            model(ids)
    finally:
        wide.kernels.rms_norm_route = real
    assert not calls


def test_fuse_glue_compiles_under_the_wrapper():
    from wide.modeling.fuse import fuse_glue, unfuse_glue

    model = _routed(num_hidden_layers=1)
    norm = model.model.layers[0].input_layernorm
    wrapper = vars(norm)["forward"]
    fuse_glue(model, "aot_eager")
    assert vars(norm)["forward"] is wrapper and hasattr(getattr(norm, INNER), "_wide_original")
    assert hasattr(model.model.norm.forward, "_wide_original")  # an unrouted norm: compiled as before
    ids = torch.randint(3, 96, (2, 5), generator=torch.Generator().manual_seed(4))
    with use_kernel_options(decode_norm_route=True):
        on = _greedy(model, ids, 3)
    off = _greedy(model, ids, 3)
    assert torch.equal(on, off)
    unfuse_glue(model)
    assert vars(norm)["forward"] is wrapper and not hasattr(getattr(norm, INNER), "_wide_original")


def test_triton_interpreter_tokens_match_with_and_without_the_switch():
    """fp32 tiny model through the Triton kernels (CPU interpreter): one fused launch per norm and router at decode,
    the tokens of the unfused kernels and of the reference."""
    script = textwrap.dedent(
        """
        import sys, torch, wide
        sys.path.insert(0, %r)
        from tests.conftest import tiny_model
        from wide.kernels import get_backend, use_kernel_options
        from wide.kernels.triton import router
        from wide.modeling.inference import enable_kernels, set_kernels
        assert get_backend("triton").is_available()
        m = tiny_model("llama", num_hidden_layers=2)
        wide.apply_wide(m, wide.WideConfig(router="lowrank", attn_group_size=2, ffn_group_size=32))
        ids = torch.randint(3, 96, (2, 6))
        am = torch.ones_like(ids)
        enable_kernels(m, "triton")
        launches = []
        real = router._margin_launch
        router._margin_launch = lambda *a, **k: launches.append(k.get("norm") is not None) or real(*a, **k)
        a = m.generate(ids, attention_mask=am, max_new_tokens=4, do_sample=False)
        assert launches and not any(launches)
        launches.clear()
        with use_kernel_options(decode_norm_route=True):
            b = m.generate(ids, attention_mask=am, max_new_tokens=4, do_sample=False)
        # the prompt (12 rows) routes through router_margin's launch, each decode step's norms through the fused one
        assert launches == [False] * 2 * 2 + [True] * 3 * 2 * 2, launches
        set_kernels(m, False)
        c = m.generate(ids, attention_mask=am, max_new_tokens=4, do_sample=False)
        assert torch.equal(a, b) and torch.equal(a, c), (a, b, c)
        print("OK")
        """
    ) % str(ROOT)
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0 and "OK" in res.stdout, res.stderr[-3000:]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("layout", [
    dict(hidden_size=256, intermediate_size=512, num_attention_heads=8, num_key_value_heads=2, head_dim=32),  # Llama
    dict(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3, head_dim=64),  # SmolLM2
], ids=["llama", "smollm2"])
@pytest.mark.parametrize("overlap", [True, False], ids=["side-stream", "one-stream"])
def test_gpu_bf16_fused_norm_route_gives_the_unfused_logits_and_tokens(layout, overlap):
    model = tiny_model("llama", num_hidden_layers=4, vocab_size=512, **layout).cuda().to(torch.bfloat16)
    wide.apply_wide(model, wide.WideConfig(sparsity=0.5, router="lowrank", attn_group_size=1, ffn_group_size=64))
    enable_kernels(model.eval(), "triton")
    wide.set_overlap_routing(model, overlap)
    ids = torch.randint(3, 512, (4, 9), generator=torch.Generator().manual_seed(5)).cuda()
    with torch.no_grad():
        pre = model(ids, use_cache=True)
        step = ids[:, -1:]
        off = model(step, past_key_values=pre.past_key_values).logits
        pre = model(ids, use_cache=True)
        with use_kernel_options(decode_norm_route=True):
            on = model(step, past_key_values=pre.past_key_values).logits
    torch.testing.assert_close(on, off, rtol=2e-2, atol=2e-2)
    tokens_off = wide.generate(model, ids, max_new_tokens=8)
    with use_kernel_options(decode_norm_route=True):
        tokens_on = wide.generate(model, ids, max_new_tokens=8)  # CUDA graphs: the fused launch captured
    assert torch.equal(tokens_on, tokens_off)
