"""`KernelOptions.decode_route`: at a batch-1 decode step the routed ``o_proj`` / ``down_proj`` launch also writes the
next RMSNorm's output and the next router's decisions (`wide.kernels.gemm_k_route`, `wide.modeling.fused_residual`);
logits, caches and tokens are those of the unfused layers."""

from __future__ import annotations

import pytest
import torch

import wide
import wide.kernels
from tests.modeling.test_fused_attention import (GPU_LAYOUTS, UNFUSED, _static_steps, assert_same_greedy,
                                                 gpu_routed, interpreted_options_match)
from tests.modeling.test_fused_residual import _routed
from wide.kernels import use_kernel_options
from wide.modeling.layer import WideLayer


@pytest.fixture
def counts(monkeypatch):
    """Calls of `gemm_k_route` and of the routers' own decisions (`WideLayer._decide`)."""
    seen = {"route": 0, "decide": 0}
    real_route, real_decide = wide.kernels.gemm_k_route, WideLayer._decide

    def route(*a, **k):
        seen["route"] += 1
        return real_route(*a, **k)

    def decide(self, *a, **k):
        seen["decide"] += 1
        return real_decide(self, *a, **k)

    monkeypatch.setattr(wide.kernels, "gemm_k_route", route)
    monkeypatch.setattr(WideLayer, "_decide", decide)
    return seen


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("qkv", [False, True], ids=["unfused-qkv", "fused-qkv"])
@pytest.mark.parametrize("attn", [True, False], ids=["both-sides", "ffn-side"])
def test_batch1_decode_routes_in_the_epilogues(arch, qkv, attn, counts):
    """Both sides: every o_proj and every down_proj but the last layer's route, only layer 0's attention decides.
    ``decode_route_attn=0``: only o_proj routes (the FFN norm and router), every layer's attention router decides on
    its own, as without `decode_route`. The same logits, caches and tokens either way."""
    model = _routed(arch)
    layers = model.config.num_hidden_layers
    ids = torch.randint(3, 96, (1, 6), generator=torch.Generator().manual_seed(1))
    steps = 3
    with use_kernel_options(decode_qkv=qkv, decode_residual=True):
        off = _static_steps(model, ids, steps)
        assert counts["route"] == 0
        decided = counts["decide"]
        with use_kernel_options(decode_route=True, decode_route_attn=attn):
            on = _static_steps(model, ids, steps)
    assert counts["route"] == steps * (2 * layers - 1 if attn else layers)
    prefill = 2 * layers
    assert counts["decide"] - decided == prefill + steps * (1 if attn else layers)
    torch.testing.assert_close(on[0], off[0], rtol=1e-5, atol=1e-5)
    for a, b in zip(on[1], off[1]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert on[2] == off[2]


def test_batches_and_prefill_keep_the_separate_launches(counts):
    model = _routed("llama")
    ids = torch.randint(3, 96, (3, 6), generator=torch.Generator().manual_seed(2))
    with use_kernel_options(**UNFUSED):
        off = _static_steps(model, ids)
    with use_kernel_options(decode_residual=True, decode_route=True):
        on = _static_steps(model, ids)
    assert counts["route"] == 0, "three rows: the fused epilogue takes batch-1 steps"
    torch.testing.assert_close(on[0], off[0], rtol=1e-5, atol=1e-5)
    with use_kernel_options(decode_residual=False, decode_route=True):  # the layer's own forward runs
        _static_steps(model, ids[:1])
    assert counts["route"] == 0


def test_forced_masks_and_coherent_decode_decide_as_before(counts):
    model = _routed("llama")
    ids = torch.randint(3, 96, (1, 6), generator=torch.Generator().manual_seed(3))
    wide.set_coherent_decode(model, refresh_every=1)
    off = _static_steps(model, ids)
    with use_kernel_options(decode_residual=True, decode_route=True):
        on = _static_steps(model, ids)
    assert counts["route"] == 0, "batch-coherent selection is not the router's own decision"
    torch.testing.assert_close(on[0], off[0], rtol=1e-5, atol=1e-5)


def test_triton_interpreter_matches_the_unfused_layers():
    """fp32 tiny Qwen2 and Llama through the Triton kernels (CPU interpreter): one launch per closing GEMM with the
    next norm and router gives the logits of the separate launches."""
    interpreted_options_match(("qwen2", "llama"), (1,), dict(decode_residual=True, decode_qkv=True),
                              dict(decode_route=True), layers=3)


@pytest.mark.parametrize("variant", [dict(decode_route_attn=False), dict(route_warm=True)],
                         ids=["ffn-side", "warm-tail"])
def test_triton_interpreter_route_variants_match_the_unfused_layers(variant):
    """The same with ``decode_route_attn=0`` (the FFN side fused, the attention router on its own launch) and with
    ``route_warm`` (the epilogue's tail operands loaded early)."""
    interpreted_options_match(("qwen2",), (1,), dict(decode_residual=True, decode_qkv=True),
                              dict(decode_route=True, **variant), layers=3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("arch, layout", GPU_LAYOUTS)
@pytest.mark.parametrize("variant", [{}, dict(decode_route_attn=False), dict(route_warm=True)],
                         ids=["both-sides", "ffn-side", "warm-tail"])
def test_gpu_bf16_route_in_the_epilogue_gives_the_unfused_logits(arch, layout, variant):
    model, ids, feed = gpu_routed(arch, layout, 1, seed=7)
    with use_kernel_options(decode_residual=True):
        off = _static_steps(model, ids, 4, feed)
        tokens_off = wide.generate(model, ids, max_new_tokens=8)
        with use_kernel_options(decode_route=True, **variant):
            on = _static_steps(model, ids, 4, feed)
            tokens_on = wide.generate(model, ids, max_new_tokens=8)  # CUDA graphs: the epilogue captured
    torch.testing.assert_close(on[0], off[0], rtol=3e-2, atol=3e-2)
    assert_same_greedy(model, tokens_on, tokens_off, ids.shape[1] + 2)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_dense_steps_of_the_routed_model_fuse_too(arch, monkeypatch):
    """Routing off (the dense backbone, `wide bench`'s dense baseline with the same launches): q / k / v in one
    launch computing every head, the residual adds inside cuBLAS (``addmm``); the logits of the plain dense step."""
    from wide.modeling.wrap import runtime_of

    model = _routed(arch)
    calls = {"qkv": 0, "addmm": 0}
    real_qkv, real_addmm = wide.kernels.decode_qkv, torch.addmm

    def qkv(*a, **k):
        calls["qkv"] += 1
        assert a[4] is None, "routing off: every q head"
        return real_qkv(*a, **k)

    def addmm(*a, **k):
        calls["addmm"] += 1
        return real_addmm(*a, **k)

    monkeypatch.setattr(wide.kernels, "decode_qkv", qkv)
    monkeypatch.setattr(torch, "addmm", addmm)
    ids = torch.randint(3, 96, (1, 6), generator=torch.Generator().manual_seed(4))
    with runtime_of(model).routing_off():
        with use_kernel_options(**UNFUSED):
            off = _static_steps(model, ids)
        assert calls == {"qkv": 0, "addmm": 0}
        with use_kernel_options(decode_qkv=True, decode_residual=True, decode_route=True):
            on = _static_steps(model, ids)
    layers = model.config.num_hidden_layers
    assert calls == {"qkv": 3 * layers, "addmm": 2 * 3 * layers}
    torch.testing.assert_close(on[0], off[0], rtol=1e-5, atol=1e-5)
    for a, b in zip(on[1], off[1]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
