"""`ffn_experts`: the routed SwiGLU FFN with wide groups run as experts (grouped GEMMs over each group's tokens,
then the fixed-order combine). On CPU the combine runs in Triton's interpreter (fp32, fp16); bf16 and
``torch._grouped_mm``'s CUTLASS kernel are checked on the GPU (``-m gpu``)."""

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
from wide.kernels.experts import combine_reference, expert_layout, ffn_path, layout_reference
from wide.kernels.options import use_kernel_options

from .cases import check

ROOT = Path(__file__).resolve().parents[2]
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _problem(M, width, ng, dtype, kind="random", seed=0, K=32, N=24, device=DEV):
    gen = torch.Generator().manual_seed(seed)
    F = width * ng
    x = torch.randn(M, K, generator=gen)
    gate, up = (torch.randn(F, K, generator=gen) * K ** -0.5 for _ in range(2))
    down = torch.randn(N, F, generator=gen) * F ** -0.5
    mask = torch.rand(M, ng, generator=gen) < 0.5
    if kind == "off":
        mask[:] = False
    elif kind == "on":
        mask[:] = True
    elif kind == "groups":  # group 0 runs for no token, the last for every token
        mask[:, 0] = False
        mask[:, -1] = True
    return [t.to(device, dtype) for t in (x, gate, up, down)] + [mask.to(device)]


def _reference(x, gate, up, down, mask):
    return get_backend("torch").ffn_experts(x.float(), gate.float(), up.float(), down.float(), mask)


def _run(x, gate, up, down, mask, **kw):
    return get_backend("triton").ffn_experts(x, gate, up, down, mask, **kw)


CASES = [pytest.param(M, width, ng, kind, id=f"M{M}-w{width}x{ng}-{kind}")
         for (M, (width, ng)), kind in zip(itertools.product([1, 7, 129, 1000], [(32, 3), (128, 2), (512, 2)]),
                                           itertools.cycle(["random", "groups", "off", "on"]))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("M,width,ng,kind", CASES)
def test_expert_path_matches_reference(M, width, ng, kind, dtype):
    x, gate, up, down, mask = _problem(M, width, ng, dtype, kind, seed=M + width)
    ref = _reference(x, gate, up, down, mask)
    out = _run(x, gate, up, down, mask, path="experts", gmm="loop")
    assert out.dtype == dtype and out.shape == ref.shape
    check(out.float(), ref, dtype, what=f"experts M={M} width={width} {kind}")


@pytest.mark.parametrize("M,kind", [(7, "random"), (129, "groups"), (1000, "off")])
def test_grouped_mm_path_matches_reference(M, kind):
    """The ``torch._grouped_mm`` call (CPU twin of CUTLASS's, fp32): offsets from the plan's counts on the device."""
    x, gate, up, down, mask = _problem(M, 64, 3, torch.float32, kind, seed=M)
    plan = make_plan(mask)
    out = _run(x, gate, up, down, mask, plan=plan, path="experts", gmm="grouped")
    check(out, _reference(x, gate, up, down, mask), torch.float32, what="grouped")


def test_fp32_partials_and_leading_dims():
    x, gate, up, down, mask = _problem(2 * 33, 32, 4, torch.float16)
    x3, mask3 = x.view(2, 33, -1), mask.view(2, 33, -1)
    out = _run(x3, gate, up, down, mask3, path="experts", partial_dtype=torch.float32)
    assert out.shape == (2, 33, down.shape[0])
    check(out.float(), _reference(x3, gate, up, down, mask3), torch.float16, what="fp32 partials")


def test_layout_slots_invert_the_rows():
    x, gate, up, down, mask = _problem(50, 32, 5, torch.float32, "groups")
    lay = expert_layout(make_plan(mask), read_counts=True)
    assert lay.capacity == int(mask.sum()) and lay.counts == tuple(mask.sum(0).tolist())
    assert torch.equal(lay.ends.long(), mask.sum(0).cumsum(0))
    t, g = mask.nonzero(as_tuple=True)
    assert torch.equal(lay.rows[lay.slot[t, g].long()].long(), t)  # every pair's row holds its token
    assert (lay.slot[~mask] == -1).all()
    eager_free = expert_layout(make_plan(mask), read_counts=False)  # the capture-time layout: M * G rows
    assert eager_free.capacity == mask.numel() and eager_free.counts is None
    assert torch.equal(eager_free.slot, lay.slot)


def test_triton_combine_equals_torch_twin():
    from wide.kernels.triton.experts import combine

    gen = torch.Generator().manual_seed(1)
    mask = torch.rand(37, 4, generator=gen) < 0.5
    lay = expert_layout(make_plan(mask), read_counts=True)
    partial = torch.randn(lay.capacity, 40, generator=gen, dtype=torch.float32)
    out = torch.full((37, 40), float("nan"))
    combine(partial, lay.slot, out)
    assert torch.equal(out, combine_reference(partial, lay.slot, torch.float32))


def _mask(M, G, kind, seed=0):
    mask = torch.rand(M, G, generator=torch.Generator().manual_seed(seed)) < 0.5
    if kind == "off":
        mask[:] = False
    elif kind == "on":
        mask[:] = True
    elif kind == "groups":  # an empty group first, a full one last
        mask[:, 0] = False
        mask[:, -1] = True
    return mask


@pytest.mark.parametrize("M,G,kind", [(1, 1, "random"), (1, 3, "on"), (7, 3, "groups"), (129, 14, "random"),
                                      (50, 5, "off"), (33, 7, "on"), (1000, 2, "groups"), (301, 28, "random")])
def test_triton_layout_equals_torch_twin(M, G, kind):
    """`build_layout` (one launch; several programs and scan tiles under the interpreter) vs `layout_reference`:
    the same ends and slots, the same rows up to the pair count (past it the kernel writes nothing)."""
    from wide.kernels.triton.experts import build_layout

    mask = _mask(M, G, kind, seed=M * G)
    ends, rows, slot = build_layout(mask)
    ref_ends, ref_rows, ref_slot = layout_reference(mask)
    n = int(mask.sum())
    assert ends.dtype == rows.dtype == slot.dtype == torch.int32 and rows.shape == (M * G,)
    assert torch.equal(ends, ref_ends) and int(ends[-1]) == n
    assert torch.equal(slot, ref_slot)
    assert torch.equal(rows[:n], ref_rows[:n])
    t, g = mask.nonzero(as_tuple=True)
    assert torch.equal(rows[slot[t, g].long()].long(), t)


def test_triton_layout_of_a_strided_mask():
    """A mask that is not contiguous (a transposed, sliced view ``[30, 4]``): read through its strides."""
    from wide.kernels.triton.experts import build_layout

    mask = (torch.rand(8, 30, generator=torch.Generator().manual_seed(2)) < 0.4).t()[:, ::2]
    assert not mask.is_contiguous()
    (ends, rows, slot), (ref_ends, ref_rows, ref_slot) = build_layout(mask), layout_reference(mask)
    n = int(mask.sum())
    assert torch.equal(ends, ref_ends) and torch.equal(slot, ref_slot) and torch.equal(rows[:n], ref_rows[:n])


def test_triton_layout_capacity_and_counts():
    from wide.kernels.triton.experts import layout_for

    mask = _mask(40, 6, "groups", seed=4)
    free = layout_for(make_plan(mask), read_counts=False)  # no host read: M * G rows of capacity
    assert free.capacity == mask.numel() and free.counts is None
    read = layout_for(make_plan(mask), read_counts=True)
    assert read.capacity == int(mask.sum()) == read.rows.shape[0]
    assert read.counts == tuple(mask.sum(0).tolist())


def test_row_kernels_stop_at_the_pairs():
    """With ``M * G`` rows of capacity, the gather and the SwiGLU never write a row past the pair count, and the
    combine never reads one: NaN there stays there and never reaches the output."""
    from wide.kernels.triton.experts import combine, gather_rows, layout_for, swiglu_rows

    gen = torch.Generator().manual_seed(6)
    mask = _mask(37, 4, "random", seed=6)
    lay = layout_for(make_plan(mask), read_counts=False)
    n, R = int(mask.sum()), lay.capacity
    assert n < R
    x = torch.randn(37, 40, generator=gen)
    xg = gather_rows(x, lay, out=torch.full((R, 40), float("nan")))
    assert torch.equal(xg[:n], x[lay.rows[:n].long()]) and xg[n:].isnan().all()
    g, u = torch.randn(R, 24, generator=gen), torch.randn(R, 24, generator=gen)
    g[n:] = float("nan")
    want = torch.nn.functional.silu(g[:n]) * u[:n]
    swiglu_rows(g, u, lay)
    torch.testing.assert_close(g[:n], want)
    assert g[n:].isnan().all()
    partial = torch.randn(R, 40, generator=gen)
    partial[n:] = float("nan")
    out = combine(partial, lay.slot, torch.empty(37, 40))
    assert torch.equal(out, combine_reference(partial[:n], lay.slot, torch.float32))


def test_grouped_path_ignores_the_rows_past_the_pairs(monkeypatch):
    """The whole grouped path (``torch._grouped_mm``'s CPU twin) with NaN in every gathered row past the pairs:
    the reference's output, no NaN."""
    from wide.kernels.triton import experts as host

    gather = host.gather_rows

    def poisoned(x2, layout, out=None):
        xg = gather(x2, layout, out)
        xg[int(layout.ends[-1]):] = float("nan")
        return xg

    monkeypatch.setattr(host, "gather_rows", poisoned)
    x, gate, up, down, mask = _problem(129, 32, 4, torch.float32, "groups", seed=8)
    out = _run(x, gate, up, down, mask, plan=make_plan(mask), path="experts", gmm="grouped")
    assert not out.isnan().any()
    check(out, _reference(x, gate, up, down, mask), torch.float32, what="poisoned capacity")


def test_same_bits_on_every_run():
    x, gate, up, down, mask = _problem(129, 32, 4, torch.float16, seed=3)
    runs = [_run(x, gate, up, down, mask, plan=make_plan(mask), path="experts") for _ in range(2)]
    assert torch.equal(runs[0], runs[1])


def test_dense_path_on_all_true_masks():
    x, gate, up, down, mask = _problem(64, 32, 2, torch.float32, "on")
    out = _run(x, gate, up, down, mask, path="dense")
    check(out, _reference(x, gate, up, down, mask), torch.float32, what="dense")


def test_path_choice(monkeypatch):
    mask = torch.rand(4096, 14) < 0.5
    plan, hinted = make_plan(mask), make_plan(mask, density_hint=0.5)
    assert ffn_path(4096, 1024, hinted, eager=False) == "experts"  # the hint: no host read, capture-safe
    assert ffn_path(4096, 1024, plan, eager=True) == "experts"
    assert ffn_path(4096, 1024, plan, eager=False) == "tiles"  # no hint, no host read allowed
    assert ffn_path(4096, 128, hinted, eager=True) == "tiles"  # narrow groups: per-tile
    assert ffn_path(4096, 512, hinted, eager=True) == "tiles"  # 512 lost to the per-tile path on the H200
    assert ffn_path(16, 1024, hinted, eager=True) == "tiles"  # decode
    assert ffn_path(4096, 1024, hinted, eager=True, enabled=False) == "tiles"  # KernelOptions(ffn_experts=False)
    assert ffn_path(4096, 1024, make_plan(mask, density_hint=0.95), eager=True) == "tiles"
    assert ffn_path(4096, 1024, make_plan(torch.ones(4096, 14, dtype=torch.bool)), eager=True) == "dense"
    # what the op does with it: the switch sends a call that would run as experts to the per-tile kernels
    from wide.kernels.triton import experts as host

    monkeypatch.setattr(experts, "EXPERT_MIN_GROUP", 32)
    monkeypatch.setattr(experts, "EXPERT_MIN_M", 64)
    seen = []
    monkeypatch.setattr(host, "combine", lambda *a: seen.append(a) or a[2])
    x, gate, up, down, mask = _problem(64, 32, 2, torch.float32)
    _run(x, gate, up, down, mask, plan=make_plan(mask, density_hint=0.5))
    assert len(seen) == 1  # on by default (KernelOptions.ffn_experts)
    with use_kernel_options(ffn_experts=False):
        _run(x, gate, up, down, mask, plan=make_plan(mask, density_hint=0.5))
    assert len(seen) == 1
    with use_kernel_options(ffn_experts=True):
        _run(x, gate, up, down, mask, plan=make_plan(mask, density_hint=0.5))
    assert len(seen) == 2


def test_bad_shapes_name_the_argument():
    x, gate, up, down, mask = _problem(8, 32, 2, torch.float32)
    with pytest.raises(ValueError, match="down"):
        wk.ffn_experts(x, gate, up, down.t(), mask)
    with pytest.raises(ValueError, match="gate"):
        wk.ffn_experts(x, gate[:, :-1], up, down, mask)
    with pytest.raises(ValueError, match="groups"):
        wk.ffn_experts(x, gate, up, down, torch.ones(8, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="path"):
        _run(x, gate, up, down, mask, path="moe")


def test_routed_model_with_wide_groups_gives_the_reference_tokens():
    """A tiny routed model whose FFN groups take the expert path (the thresholds lowered to its size) through
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
        experts.EXPERT_MIN_GROUP, experts.EXPERT_MIN_M = 64, 1
        calls, combine = [], host.combine
        host.combine = lambda *a: calls.append(1) or combine(*a)
        m = tiny_model("llama", num_hidden_layers=2)
        wide.apply_wide(m, wide.WideConfig(sparsity=0.5, attn_group_size=2, ffn_group_size=64))
        ids = torch.randint(3, 96, (2, 9))
        am = torch.ones_like(ids)
        enable_kernels(m, "triton")
        with use_kernel_options(ffn_experts=True):  # off by default
            a = m.generate(ids, attention_mask=am, max_new_tokens=4, do_sample=False)
        assert calls, "the expert path never ran"
        set_kernels(m, False)
        b = m.generate(ids, attention_mask=am, max_new_tokens=4, do_sample=False)
        assert torch.equal(a, b), (a, b)
        print("OK")
        """
    ) % str(ROOT)
    env = dict(os.environ, TRITON_INTERPRET="1")
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0 and "OK" in res.stdout, res.stderr[-3000:]


def test_benchmark_smoke_writes_json(tmp_path):
    """benchmarks/experts.py on tiny CPU shapes: every row timed, the JSON written."""
    out = tmp_path / "experts.json"
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "experts.py"), "--smoke", "--m", "8",
                          "--width", "128", "--density", "0.5", "--json", str(out)],
                         env=dict(os.environ, PYTHONPATH=str(ROOT), TRITON_INTERPRET="1"), capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    import json

    rows = json.loads(out.read_text())["rows"]
    assert [r["part"] for r in rows] == ["ffn", "layout", "down", "gate_up", "gemm_k", "gemm_k"]
    assert rows[0]["auto_path"] == "experts" and max(rows[0]["err"].values()) < 1e-4
    assert all(max(r["err"].values()) < 1e-4 for r in rows[-2:])  # gemm_k: per tile and as experts


# ---- GPU: bf16, CUTLASS's grouped GEMM, the 8B shape ----------------------------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("width", [512, 1024, 2048])
@pytest.mark.parametrize("M,kind", [(4096, "random"), (1000, "groups"), (129, "off"), (4096, "on")])
@pytest.mark.parametrize("gmm", ["grouped", "loop"])
def test_bf16_expert_path_on_gpu(width, M, kind, gmm):
    K, N = 4096, 4096
    x, gate, up, down, mask = _problem(M, width, 14336 // width, torch.bfloat16, kind, seed=width, K=K, N=N,
                                       device="cuda")
    ref = _reference(x, gate, up, down, mask)
    out = _run(x, gate, up, down, mask, plan=make_plan(mask), path="experts", gmm=gmm)
    check(out.float(), ref, torch.bfloat16, what=f"bf16 experts {gmm} width={width} M={M} {kind}")
    again = _run(x, gate, up, down, mask, plan=make_plan(mask), path="experts", gmm=gmm)
    assert torch.equal(out, again), "not deterministic"


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("M,G", [(4096, 14), (16384, 14), (16384, 7), (4097, 28), (1000, 3)])
@pytest.mark.parametrize("kind", ["random", "groups"])
def test_triton_layout_on_gpu(M, G, kind):
    """`build_layout` at its GPU tile sizes (several scan tiles per program) vs the torch twin."""
    from wide.kernels.triton.experts import build_layout

    mask = _mask(M, G, kind, seed=G).cuda()
    (ends, rows, slot), (ref_ends, ref_rows, ref_slot) = build_layout(mask), layout_reference(mask)
    n = int(mask.sum())
    assert torch.equal(ends, ref_ends) and torch.equal(slot, ref_slot) and torch.equal(rows[:n], ref_rows[:n])


@pytest.mark.gpu
@needs_cuda
@use_kernel_options(ffn_experts=True)
def test_bf16_auto_path_and_graph_capture_on_gpu():
    """The op's own choice at the 8B shape (hinted plan: experts with no host read), inside a CUDA graph too."""
    x, gate, up, down, mask = _problem(4096, 1024, 14, torch.bfloat16, seed=5, K=4096, N=4096, device="cuda")
    ref = _reference(x, gate, up, down, mask)
    plan = make_plan(mask, density_hint=0.5).materialize(flat=True)
    out = wk.ffn_experts(x, gate, up, down, mask, plan=plan)
    check(out.float(), ref, torch.bfloat16, what="auto")
    graph, buf = torch.cuda.CUDAGraph(), torch.empty_like(out)
    plan2 = make_plan(mask, density_hint=0.5).materialize(flat=True)
    wk.ffn_experts(x, gate, up, down, mask, plan=plan2, out=buf)  # warm-up
    plan3 = make_plan(mask, density_hint=0.5).materialize(flat=True)
    with torch.cuda.graph(graph):
        wk.ffn_experts(x, gate, up, down, mask, plan=plan3, out=buf)
    buf.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(buf, out)
