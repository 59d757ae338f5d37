"""`KernelOptions.decode_residual`: a decode step's residual adds run in the epilogues of the routed ``o_proj`` /
``down_proj`` (`wide.modeling.fused_residual`); logits and tokens are those of transformers' decoder layer."""

from __future__ import annotations

import pytest
import torch

import wide
import wide.kernels
from tests.conftest import tiny_model
from tests.modeling.test_fused_attention import (GPU_LAYOUTS, UNFUSED, _static_steps, assert_same_greedy,
                                                 gpu_routed, interpreted_options_match, unfused_then_fused)
from wide.kernels import use_kernel_options
from wide.modeling import fused_residual
from wide.modeling.inference import enable_kernels

def _routed(arch="llama", backend="torch", **sizes):
    model = tiny_model(arch, **sizes)
    wide.apply_wide(model, wide.WideConfig(sparsity=0.5, router="lowrank", attn_group_size=2, ffn_group_size=32))
    return enable_kernels(model.eval(), backend)


@pytest.fixture
def residuals(monkeypatch):
    """The row count of every `gemm_k` call that got a residual."""
    seen = []
    real = wide.kernels.gemm_k

    def spy(x, *a, residual=None, **k):
        if residual is not None:
            seen.append(x.reshape(-1, x.shape[-1]).shape[0])
        return real(x, *a, residual=residual, **k)

    monkeypatch.setattr(wide.kernels, "gemm_k", spy)
    return seen


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("qkv", [False, True], ids=["unfused-qkv", "fused-qkv"])
def test_decode_steps_add_the_residual_in_the_epilogue(arch, qkv, residuals):
    model = _routed(arch)
    assert all(fused_residual.INNER in vars(layer) for layer in model.model.layers)
    ids = torch.randint(3, 96, (3, 6), generator=torch.Generator().manual_seed(0))
    off, on = unfused_then_fused(model, ids, residuals, dict(decode_qkv=qkv, decode_residual=False),
                                 decode_residual=True)
    assert residuals == [3] * 2 * 3 * model.config.num_hidden_layers, "o_proj and down_proj of every decode step"
    torch.testing.assert_close(on[0], off[0], rtol=1e-5, atol=1e-5)
    for a, b in zip(on[1], off[1]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_prefill_reference_path_and_other_layers_keep_the_adds(residuals):
    from wide.modeling.inference import set_kernels

    model = _routed("llama")
    ids = torch.randint(3, 96, (2, 6), generator=torch.Generator().manual_seed(1))
    with use_kernel_options(decode_residual=True), torch.no_grad():
        out = model(ids, use_cache=True)  # a prefill: the layer's own forward
        set_kernels(model, False)  # the reference path: the layer's own forward
        model(ids[:, -1:], past_key_values=out.past_key_values)
    assert not residuals
    layer = _routed("qwen3").model.layers[0]  # not a reproduced form
    assert not fused_residual.supported(layer) and fused_residual.INNER not in vars(layer)


def test_triton_interpreter_matches_the_unfused_adds():
    """fp32 tiny Qwen2 through the Triton kernels (CPU interpreter): the residual in gemm_k's epilogue, split-K and
    not, gives the logits of the separate adds."""
    interpreted_options_match(("qwen2",), (1, 3), UNFUSED, dict(decode_residual=True, decode_qkv=True))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("arch, layout", GPU_LAYOUTS)
@pytest.mark.parametrize("batch", [1, 5])
def test_gpu_bf16_residual_in_the_epilogue_gives_the_unfused_logits(arch, layout, batch):
    model, ids, feed = gpu_routed(arch, layout, batch, seed=6)
    with use_kernel_options(**UNFUSED):
        off = _static_steps(model, ids, 4, feed)
        tokens_off = wide.generate(model, ids, max_new_tokens=8)
    with use_kernel_options(decode_qkv=False, decode_residual=True):
        on = _static_steps(model, ids, 4, feed)
        tokens_on = wide.generate(model, ids, max_new_tokens=8)  # CUDA graphs: the epilogue adds captured
    # the epilogue adds to the rounded projection: the separate add's bits, so every router decides alike
    torch.testing.assert_close(on[0], off[0], rtol=1e-2, atol=1e-2)
    assert_same_greedy(model, tokens_on, tokens_off, ids.shape[1] + 2)
