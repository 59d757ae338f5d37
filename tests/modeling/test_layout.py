"""`wide.set_weight_layout`: the routed linears' ``o_proj`` / ``down_proj`` weights stored column-major give the
row-major model's outputs (reference path, triton kernels in the interpreter and on the GPU), keep the parameters
and state-dict keys, export row-major, and bad input is named."""

from __future__ import annotations

import pytest
import torch

import wide
from tests.conftest import tiny_model
from tests.modeling.test_fused_attention import _static_steps, run_interpreted
from wide.modeling.layout import set_weight_layout, weight_layout


def _routed(arch="llama", **sizes):
    model = tiny_model(arch, **sizes)
    wide.apply_wide(model, wide.WideConfig(sparsity=0.5, router="lowrank", attn_group_size=2, ffn_group_size=32))
    return model.eval()


def _reduction_weights(model):
    return [w for layer in model.model.layers for w in (layer.self_attn.o_proj.weight, layer.mlp.down_proj.weight)]


def test_column_major_keeps_parameters_values_and_keys():
    model = _routed()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    params = [id(p) for p in model.parameters()]
    assert set_weight_layout(model, "column") == 2 * model.config.num_hidden_layers
    assert all(weight_layout(w) == "column" and w.stride() == (1, w.shape[0]) for w in _reduction_weights(model))
    assert weight_layout(model.model.layers[0].self_attn.q_proj.weight) == "row"  # only the gemm_k weights
    assert [id(p) for p in model.parameters()] == params
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], v) for k, v in before.items())
    assert set_weight_layout(model, "column") == 0  # already
    assert set_weight_layout(model, "row") == 2 * model.config.num_hidden_layers
    assert all(w.is_contiguous() for w in _reduction_weights(model))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("backend", ["torch", "gather"])
def test_same_logits_on_the_reference_backends(arch, backend):
    model = wide.enable_kernels(_routed(arch), backend)
    ids = torch.randint(3, 96, (2, 7), generator=torch.Generator().manual_seed(0))
    row = _static_steps(model, ids, 3)
    set_weight_layout(model, "column")
    col = _static_steps(model, ids, 3)
    torch.testing.assert_close(col[0], row[0], rtol=1e-5, atol=1e-5)


def test_export_writes_row_major_weights(tmp_path):
    from safetensors.torch import load_file

    model = _routed()
    set_weight_layout(model, "column")
    wide.export(model, tmp_path / "m")
    saved = load_file(str(tmp_path / "m" / "model.safetensors"))
    w = saved["model.layers.0.mlp.down_proj.weight"]
    assert w.is_contiguous() and torch.equal(w, model.model.layers[0].mlp.down_proj.weight)


def test_bad_layout_and_unrouted_model_are_named():
    with pytest.raises(ValueError, match="layout: one of row, column, got 'col'"):
        set_weight_layout(_routed(), "col")
    with pytest.raises(ValueError, match="not routed"):
        set_weight_layout(tiny_model("llama"), "column")


def test_triton_interpreter_column_major_gives_the_row_major_logits():
    """fp32 tiny Llama / Qwen2 through the Triton kernels (CPU interpreter), prefill and decode steps at 1 and 3
    rows: column-major o_proj / down_proj weights give the row-major logits."""
    run_interpreted("""
        from tests.modeling.test_fused_attention import _static_steps, tiny_triton_model
        from wide.modeling.layout import set_weight_layout
        for arch in ("llama", "qwen2"):
            m = tiny_triton_model(arch, 2)
            for rows in (1, 3):
                ids = torch.randint(3, 96, (rows, 5))
                set_weight_layout(m, "row")
                off = _static_steps(m, ids, 2)
                set_weight_layout(m, "column")
                on = _static_steps(m, ids, 2)
                torch.testing.assert_close(on[0], off[0], rtol=1e-4, atol=1e-4)
        print("OK")
        """)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("batch", [1, 5])
def test_gpu_bf16_column_major_gives_the_row_major_logits(batch):
    """bf16 on the GPU, the tuned column-major gemm_k configs (batch 1: GEMV, 5: skinny tiles) against row-major:
    random routers reseeded per run draw the same masks (a low-rank router's near-zero margin could flip on an ulp
    of another summation order), so the logits differ by rounding only."""
    from tests.modeling.test_fused_attention import GPU_LAYOUTS

    for p in GPU_LAYOUTS:
        arch, layout = p.values
        model = tiny_model(arch, num_hidden_layers=3, vocab_size=512, **layout).cuda().to(torch.bfloat16)
        wide.apply_wide(model, wide.WideConfig(sparsity=0.5, router="random", attn_group_size=1, ffn_group_size=128))
        wide.enable_kernels(model.eval(), "triton")
        gen = torch.Generator().manual_seed(9)
        ids, feed = (torch.randint(3, 512, (batch, n), generator=gen).cuda() for n in (9, 4))
        runs = {}
        for lay in ("row", "column"):
            set_weight_layout(model, lay)
            torch.manual_seed(0)
            runs[lay] = _static_steps(model, ids, 4, feed)[0].float()
        scale = runs["row"].abs().max().item()
        torch.testing.assert_close(runs["column"], runs["row"], rtol=2e-2, atol=2e-2 * scale)
