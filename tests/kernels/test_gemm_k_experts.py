"""`gemm_k` as experts (`KernelOptions.gemm_k_experts`): a reduction-width routed GEMM (``o_proj`` over attention
groups of whole KV-head units) run as one grouped GEMM over each group's gathered columns plus the fixed-order
combine. On CPU the Triton kernels run in the interpreter (fp32, fp16); bf16 and CUTLASS's grouped GEMM on the GPU."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import wide.kernels as wk
from wide.kernels import experts, get_backend, make_plan
from wide.kernels.experts import expert_layout, gather_cols_reference, gemm_k_path
from wide.kernels.options import use_kernel_options

from .cases import check

ROOT = Path(__file__).resolve().parents[2]


def _problem(M, width, ng, dtype, kind="random", seed=0, N=24, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    K = width * ng
    x = torch.randn(M, K, generator=gen)
    w = torch.randn(N, K, generator=gen) * K ** -0.5
    bias = torch.randn(N, generator=gen)
    residual = torch.randn(M, N, generator=gen)
    mask = torch.rand(M, ng, generator=gen) < 0.5
    if kind == "off":
        mask[:] = False
    elif kind == "on":
        mask[:] = True
    elif kind == "groups":  # group 0 runs for no token, the last for every token
        mask[:, 0] = False
        mask[:, -1] = True
    x, w, bias, residual = (t.to(device, dtype) for t in (x, w, bias, residual))
    return x, w, bias, residual, mask.to(device)


def _reference(x, w, mask, bias=None):
    return get_backend("torch").gemm_k(x.float(), w.float(), mask, bias=None if bias is None else bias.float())


def _run(x, w, mask, bias=None, residual=None, **kw):
    from wide.kernels.triton.experts import gemm_k_experts

    return gemm_k_experts(x, w, mask, bias, kw.pop("plan", None), None, residual, **kw)


CASES = [pytest.param(M, width, ng, kind, id=f"M{M}-w{width}x{ng}-{kind}")
         for (M, (width, ng)), kind in zip(itertools.product([1, 7, 129, 1000], [(32, 3), (64, 2), (512, 2)]),
                                           itertools.cycle(["random", "groups", "off", "on"]))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("M,width,ng,kind", CASES)
def test_expert_gemm_k_matches_reference(M, width, ng, kind, dtype):
    x, w, _, _, mask = _problem(M, width, ng, dtype, kind, seed=M + width)
    out = _run(x, w, mask, gmm="loop")
    assert out.dtype == dtype and out.shape == (M, w.shape[0])
    check(out.float(), _reference(x, w, mask), dtype, what=f"gemm_k experts M={M} width={width} {kind}")


@pytest.mark.parametrize("M,kind", [(7, "random"), (129, "groups"), (1000, "off"), (33, "on")])
def test_grouped_mm_gemm_k_matches_reference(M, kind):
    """``torch._grouped_mm`` (fp32 on CPU) with offsets read on the device: `gather_cols`'s kernel feeds it."""
    x, w, _, _, mask = _problem(M, 32, 4, torch.float32, kind, seed=M)
    out = _run(x, w, mask, plan=make_plan(mask), gmm="grouped")
    check(out, _reference(x, w, mask), torch.float32, what="grouped")


def test_bias_residual_and_leading_dims():
    x, w, bias, residual, mask = _problem(2 * 33, 32, 3, torch.float16, seed=4)
    x3, mask3, res3 = x.view(2, 33, -1), mask.view(2, 33, -1), residual.view(2, 33, -1)
    out = _run(x3, w, mask3, bias=bias, residual=res3)
    assert out.shape == (2, 33, w.shape[0])
    ref = _reference(x3, w, mask3, bias) + res3.float()
    check(out.float(), ref, torch.float16, what="bias + residual")
    out32 = _run(x3, w, mask3, partial_dtype=torch.float32)  # fp32 partial rows take the loop
    check(out32.float(), _reference(x3, w, mask3), torch.float16, what="fp32 partials")


@pytest.mark.parametrize("M,G,width", [(1, 1, 16), (7, 3, 32), (129, 8, 32), (300, 5, 48)])
def test_triton_gather_cols_equals_torch_twin(M, G, width):
    from wide.kernels.triton.experts import gather_cols, layout_for

    x, _, _, _, mask = _problem(M, width, G, torch.float32, "groups" if G > 1 else "random", seed=G)
    plan = make_plan(mask)
    lay = layout_for(plan, read_counts=False)  # M * G rows of capacity: only the pairs' are written
    n = int(mask.sum())
    got, ref = gather_cols(x, lay, width), gather_cols_reference(x, lay, width)
    assert got.shape == (M * G, width) and torch.equal(got[:n], ref[:n])
    t, g = mask.nonzero(as_tuple=True)
    assert torch.equal(got[lay.slot[t, g].long()], x.view(M, G, width)[t, g])  # every pair: its own columns


def test_same_bits_on_every_run():
    x, w, _, _, mask = _problem(129, 32, 4, torch.float16, seed=3)
    runs = [_run(x, w, mask, plan=make_plan(mask)) for _ in range(2)]
    assert torch.equal(runs[0], runs[1])


def test_path_choice_and_the_switch(monkeypatch):
    mask = torch.rand(4096, 8) < 0.5
    hinted = make_plan(mask, density_hint=0.5)
    assert gemm_k_path(4096, 512, hinted, eager=False, enabled=True) == "experts"
    assert gemm_k_path(4096, 512, hinted, eager=True, enabled=False) == "tiles"  # the switch (off by default)
    assert gemm_k_path(4096, 256, hinted, eager=True, enabled=True) == "tiles"  # narrow groups
    assert gemm_k_path(16, 512, hinted, eager=True, enabled=True) == "tiles"  # decode
    assert gemm_k_path(4096, 512, make_plan(mask), eager=False, enabled=True) == "tiles"  # density needs a read
    assert gemm_k_path(4096, 512, make_plan(torch.ones(4096, 8, dtype=torch.bool)), True, True) == "tiles"
    # what the op does: the switch sends a call that qualifies to the expert path, else the per-tile kernels
    from wide.kernels.triton import experts as host

    monkeypatch.setattr(experts, "K_EXPERT_MIN_GROUP", 32)
    monkeypatch.setattr(experts, "EXPERT_MIN_M", 64)
    seen = []
    real = host.combine
    monkeypatch.setattr(host, "combine", lambda *a: seen.append(1) or real(*a))
    x, w, bias, _, mask = _problem(64, 32, 3, torch.float32, seed=2)
    ref = _reference(x, w, mask, bias)
    out = wk.gemm_k(x, w, mask, bias=bias, plan=make_plan(mask, density_hint=0.5), backend="triton")
    assert not seen  # off by default
    check(out, ref, torch.float32, what="per tile")
    with use_kernel_options(gemm_k_experts=True):
        out = wk.gemm_k(x, w, mask, bias=bias, plan=make_plan(mask, density_hint=0.5), backend="triton")
    assert len(seen) == 1
    check(out, ref, torch.float32, what="experts through the op")


def test_routed_model_with_expert_o_proj_gives_the_reference_tokens():
    """A tiny routed model whose ``o_proj`` (and FFN) take the expert paths (thresholds lowered to its size) through
    the Triton backend (CPU interpreter): the torch reference's greedy tokens."""
    script = textwrap.dedent(
        """
        import sys, torch, wide
        sys.path.insert(0, %r)
        from tests.conftest import tiny_model
        from wide.kernels import experts
        from wide.kernels.triton import experts as host
        from wide.kernels.options import use_kernel_options
        from wide.modeling.inference import enable_kernels, set_kernels
        experts.K_EXPERT_MIN_GROUP, experts.EXPERT_MIN_M = 16, 1
        calls, real = [], host.gemm_k_experts
        host.gemm_k_experts = lambda *a, **k: calls.append(1) or real(*a, **k)
        m = tiny_model("llama", num_hidden_layers=2)
        wide.apply_wide(m, wide.WideConfig(sparsity=0.5, attn_group_size=2, ffn_group_size=32))
        ids = torch.randint(3, 96, (2, 9))
        am = torch.ones_like(ids)
        enable_kernels(m, "triton")
        with use_kernel_options(gemm_k_experts=True):
            a = m.generate(ids, attention_mask=am, max_new_tokens=4, do_sample=False)
        assert calls, "the expert gemm_k never ran"
        set_kernels(m, False)
        b = m.generate(ids, attention_mask=am, max_new_tokens=4, do_sample=False)
        assert torch.equal(a, b), (a, b)
        print("OK", len(calls))
        """
    ) % str(ROOT)
    env = dict(os.environ, TRITON_INTERPRET="1")
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0 and "OK" in res.stdout, res.stderr[-3000:]


def test_bad_gmm_is_named():
    x, w, _, _, mask = _problem(8, 32, 2, torch.float32)
    with pytest.raises(ValueError, match="gmm"):
        _run(x, w, mask, gmm="moe")
    lay = expert_layout(make_plan(mask), read_counts=False)
    with pytest.raises(ValueError, match="counts"):
        experts.reduce_gemm(x, w, lay, "loop", torch.float32)


# ---- GPU: bf16, CUTLASS's grouped GEMM, the 8B o_proj shape ----------------------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("width,ng", [(512, 8), (768, 2), (1024, 14)])
@pytest.mark.parametrize("M,kind", [(4096, "random"), (1000, "groups"), (129, "off"), (4096, "on")])
@pytest.mark.parametrize("gmm", ["grouped", "loop"])
def test_bf16_expert_gemm_k_on_gpu(width, ng, M, kind, gmm):
    x, w, _, _, mask = _problem(M, width, ng, torch.bfloat16, kind, seed=width, N=4096, device="cuda")
    out = _run(x, w, mask, plan=make_plan(mask), gmm=gmm)
    check(out.float(), _reference(x, w, mask), torch.bfloat16, what=f"bf16 {gmm} width={width} M={M} {kind}")
    again = _run(x, w, mask, plan=make_plan(mask), gmm=gmm)
    assert torch.equal(out, again), "not deterministic"


@pytest.mark.gpu
@needs_cuda
@use_kernel_options(gemm_k_experts=True)
def test_bf16_auto_gemm_k_experts_and_graph_capture_on_gpu():
    """The op's own choice at the 8B o_proj shape (hinted plan: experts, no host read), inside a CUDA graph too."""
    x, w, _, residual, mask = _problem(4096, 512, 8, torch.bfloat16, seed=5, N=4096, device="cuda")
    ref = _reference(x, w, mask) + residual.float()
    plan = make_plan(mask, density_hint=0.5).materialize(flat=True)
    out = wk.gemm_k(x, w, mask, plan=plan, residual=residual)
    check(out.float(), ref, torch.bfloat16, what="auto")
    graph, buf = torch.cuda.CUDAGraph(), torch.empty_like(out)
    wk.gemm_k(x, w, mask, plan=make_plan(mask, density_hint=0.5).materialize(flat=True), out=buf)  # warm-up
    plan3 = make_plan(mask, density_hint=0.5).materialize(flat=True)
    with torch.cuda.graph(graph):
        wk.gemm_k(x, w, mask, plan=plan3, out=buf)
    buf.zero_()
    graph.replay()
    torch.cuda.synchronize()
    check(buf.float(), _reference(x, w, mask), torch.bfloat16, what="graph replay")
