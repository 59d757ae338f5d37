"""The routing ops: `router_margin` (a linear / low-rank router's margin or decision) and `coherent_select`
(batch-coherent decode's shared top-k), torch reference against the router code and the Triton kernels."""

import os

import pytest
import torch

from wide import kernels
from wide.kernels import make_plan
from wide.routers.base import RouterSpec, rms_normalize
from wide.routers.lowrank import LowRankRouter

INTERPRET = pytest.mark.skipif(not os.environ.get("TRITON_INTERPRET"), reason="interpreter check")


def _spec(d=64, g=7, rank=8):
    return RouterSpec(kind="ffn", layer_idx=0, num_layers=1, hidden_size=d, num_groups=g, group_size=16,
                      target_sparsity=0.5, rank=rank)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("normalize", [True, False])
def test_reference_is_the_low_rank_routers_eval_path(dtype, normalize):
    torch.manual_seed(0)
    router = LowRankRouter(_spec(), normalize=normalize, execute_bias=0.3).to(dtype)
    x = torch.randn(2, 5, 64) * 3
    w, b = router._fold.weights(router.up)
    h = rms_normalize(x) if normalize else x
    expected = torch.nn.functional.linear(router.down(h.to(dtype)), w, b).float()  # the router's own layers
    margin = kernels.router_margin(x, router.down.weight, w, b, normalize=normalize, decide=False, backend="torch")
    assert torch.equal(margin, expected) and torch.equal(router.execute_margin(x), expected)
    decision = kernels.router_margin(x, router.down.weight, w, b, normalize=normalize, backend="torch")
    assert decision.dtype == torch.bool and torch.equal(decision, expected >= 0)
    torch.testing.assert_close(expected, router(x)[..., 0].float() - router(x)[..., 1].float(),
                               rtol=0.05 if dtype == torch.bfloat16 else 1e-5, atol=0.05 if dtype == torch.bfloat16 else 1e-5)


@INTERPRET
@pytest.mark.parametrize("rows,d,rank,groups", [(1, 64, 8, 7), (3, 100, 4, 1), (17, 64, 32, 70), (2, 48, 5, 130),
                                                 # wide rows: the first GEMV splits over 4 to 64 programs per row
                                                 (1, 1000, 8, 7), (17, 3000, 32, 70), (64, 520, 5, 9)])
@pytest.mark.parametrize("normalize,with_bias", [(True, True), (False, False)])
@pytest.mark.parametrize("xdtype", [torch.float32, torch.bfloat16])
def test_triton_router_margin_matches_reference(rows, d, rank, groups, normalize, with_bias, xdtype):
    torch.manual_seed(rows + d + groups)
    x = (torch.randn(rows, d) * 2).to(xdtype)
    down = torch.randn(rank, d) / d ** 0.5
    up = torch.randn(groups, rank) / rank ** 0.5
    bias = torch.randn(groups) * 0.1 if with_bias else None
    ref = kernels.router_margin(x, down, up, bias, normalize=normalize, decide=False, backend="torch")
    got = kernels.router_margin(x, down, up, bias, normalize=normalize, decide=False, backend="triton")
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)
    decided = kernels.router_margin(x, down, up, bias, normalize=normalize, backend="triton")
    clear = ref.abs() > 1e-4  # a margin this close to 0 may round either way
    assert decided.dtype == torch.bool and decided.shape == (rows, groups)
    assert torch.equal(decided[clear], (ref >= 0)[clear])


@INTERPRET
def test_triton_router_margin_split_programs_reset_their_counters():
    """Each row's last program adds the partial sums and resets the row's arrival counter: calls in a row
    (different row counts, margins and decisions) give the same answers as the first."""
    from wide.kernels.triton.common import arrival_counters

    torch.manual_seed(3)
    down, up, bias = torch.randn(16, 2000) / 45, torch.randn(11, 16) / 4, torch.randn(11) * 0.1
    xs = [torch.randn(rows, 2000) for rows in (1, 5, 64, 5)]
    for _ in range(2):
        for x in xs:
            ref = kernels.router_margin(x, down, up, bias, decide=False, backend="torch")
            got = kernels.router_margin(x, down, up, bias, decide=False, backend="triton")
            torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)
            assert torch.equal(kernels.router_margin(x, down, up, bias, backend="triton")[ref.abs() > 1e-4],
                               (ref >= 0)[ref.abs() > 1e-4])
    assert not arrival_counters(torch.device("cpu"), 64).any()


@INTERPRET
def test_triton_router_margin_single_linear_and_leading_dims():
    torch.manual_seed(1)
    x = torch.randn(2, 1, 40)
    weight, bias = torch.randn(9, 40) / 7, torch.randn(9)
    ref = kernels.router_margin(x, weight, None, bias, decide=False, backend="torch")
    got = kernels.router_margin(x, weight, None, bias, decide=False, backend="triton")
    assert got.shape == (2, 1, 9)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("rows,d,rank,groups", [(65, 64, 8, 7), (200, 100, 4, 1), (333, 520, 32, 70), (70, 48, 5, 130),
                                                 (130, 72, 128, 9), (100, 64, None, 70), (99, 40, None, 9)])
@pytest.mark.parametrize("normalize,with_bias", [(True, True), (False, False), (True, False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_rows_take_the_cublas_route(rows, d, rank, groups, normalize, with_bias, dtype, monkeypatch):
    """From 65 rows the triton backend's `router_margin` is the first GEMM over the raw rows with the RMS scale
    after it (`router._router_margin_rows`, cuBLAS on a GPU) instead of the decode kernel: low-rank (``rank``) and linear
    (``None``) routers, odd sizes; fp32 equals the reference to rounding, bf16 within its precision."""
    from wide.kernels.triton import router as tr

    used = []
    real = tr._router_margin_rows
    monkeypatch.setattr(tr, "_router_margin_rows", lambda *a, **k: used.append(1) or real(*a, **k))
    torch.manual_seed(rows + d + groups)
    x = (torch.randn(rows, d) * 2).to(dtype)
    down = (torch.randn(rank or groups, d) / d ** 0.5).to(dtype)
    up = (torch.randn(groups, rank) / rank ** 0.5).to(dtype) if rank else None
    bias = (torch.randn(groups) * 0.1).to(dtype) if with_bias else None
    f32 = lambda t: None if t is None else t.float()  # noqa: E731
    ref = kernels.router_margin(x.float(), f32(down), f32(up), f32(bias), normalize=normalize, decide=False,
                                backend="torch")
    got = kernels.router_margin(x, down, up, bias, normalize=normalize, decide=False, backend="triton")
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, ref, rtol=tol, atol=tol * ref.abs().max().item())
    decided = kernels.router_margin(x, down, up, bias, normalize=normalize, backend="triton")
    clear = ref.abs() > 5 * tol * ref.abs().max()
    assert decided.dtype == torch.bool and decided.shape == (rows, groups) and got.dtype == torch.float32
    assert torch.equal(decided[clear], (ref >= 0)[clear]) and len(used) == 2


@INTERPRET
def test_prefill_router_weight_halves_are_cached_until_the_weights_change():
    """fp32 router weights enter a prefill's GEMM as two bf16 halves, made once per weight tensor and made again
    when the weights change in place."""
    from wide.kernels.triton import router as tr

    torch.manual_seed(5)
    x = torch.randn(80, 32).to(torch.bfloat16)
    down, up = torch.randn(4, 32) / 6, torch.randn(5, 4) / 2
    first = kernels.router_margin(x, down, up, decide=False, backend="triton")
    halves = tr._HALVES[id(down)][3]
    assert halves.shape == (8, 32) and halves.dtype == torch.bfloat16
    torch.testing.assert_close(halves[:4].float() + halves[4:].float(), down, rtol=2e-5, atol=1e-7)
    assert torch.equal(kernels.router_margin(x, down, up, decide=False, backend="triton"), first)
    assert tr._HALVES[id(down)][3] is halves
    with torch.no_grad():
        down.mul_(-2)
    again = kernels.router_margin(x, down, up, decide=False, backend="triton")
    assert tr._HALVES[id(down)][3] is not halves
    torch.testing.assert_close(again, kernels.router_margin(x.float(), down, up, decide=False, backend="torch"),
                               rtol=1e-4, atol=1e-5)


def test_router_margin_rejects_bad_shapes():
    x = torch.randn(2, 16)
    with pytest.raises(ValueError, match="down"):
        kernels.router_margin(x, torch.randn(4, 15))
    with pytest.raises(ValueError, match="up"):
        kernels.router_margin(x, torch.randn(4, 16), torch.randn(3, 5))
    with pytest.raises(ValueError, match="bias"):
        kernels.router_margin(x, torch.randn(4, 16), torch.randn(3, 4), torch.randn(4))


def _state(g):
    return torch.zeros(g), torch.zeros(g, dtype=torch.bool), torch.zeros((), dtype=torch.int64)


def _run(backend, margins, keep, memory, refresh):
    g = margins[0].shape[1]
    ema, sel, step = _state(g)
    ema.copy_(torch.sigmoid(margins[0]).mean(0))  # the layer starts the memory from the first step
    groups = (torch.full((g,), -1, dtype=torch.int32), torch.full((1,), -1, dtype=torch.int32))
    out = []
    for m in margins:
        kernels.coherent_select(m, ema, sel, step, keep=keep, memory=memory, refresh_every=refresh, groups=groups,
                                backend=backend)
        # the group list written beside the selection is RoutingPlan.group_list's of the shared mask
        order, n = make_plan(sel.view(1, g)).group_list()
        assert torch.equal(groups[0], order) and torch.equal(groups[1], n), backend
        out.append((ema.clone(), sel.clone(), int(step)))
    return out


def test_coherent_reference_selects_the_top_ema_groups_on_schedule():
    torch.manual_seed(0)
    margins = [torch.randn(4, 10) for _ in range(5)]
    steps = _run("torch", margins, keep=3, memory=0.5, refresh=2)
    for i, (ema, sel, step) in enumerate(steps):
        assert step == i + 1 and sel.sum() == 3
        if i % 2 == 0:  # refreshed: exactly the three best EMAs
            assert torch.equal(sel, torch.zeros(10, dtype=torch.bool).index_fill_(0, ema.topk(3).indices, True))
        else:
            assert torch.equal(sel, steps[i - 1][1])


def test_coherent_reference_keep_none_follows_the_rows_own_counts():
    """keep=None: the rows' mean count of executing groups (rounded half up, at least 1), no host sync."""
    ema, sel, step = _state(8)
    m = torch.full((2, 8), -1.0)
    m[0, :3] = 1.0
    m[1, :2] = 1.0  # 3 and 2 executing: 2.5 rounds up to 3
    kernels.coherent_select(m, ema, sel, step, keep=None, memory=0.0, backend="torch")
    assert sel.tolist() == [True, True, True] + [False] * 5
    m[0, :3] = -1.0
    m[1, :2] = -1.0  # none executing: one group all the same
    kernels.coherent_select(m, ema, sel, step, keep=None, memory=0.0, backend="torch")
    assert int(sel.sum()) == 1


@pytest.mark.parametrize("scale,expect", [(1.0, 3), (1.5, 4), (0.5, 1), (0.3, 1), (16.0, 8), (1.2, 3)])
def test_coherent_keep_scale_multiplies_the_rows_mean_count(scale, expect):
    """Counts 3 and 2 (mean 2.5) times the scale, rounded half up, within [1, G]."""
    ema, sel, step = _state(8)
    m = torch.full((2, 8), -1.0)
    m[0, :3] = 1.0
    m[1, :2] = 1.0
    kernels.coherent_select(m, ema, sel, step, keep=None, keep_scale=scale, backend="torch")
    assert int(sel.sum()) == expect


def test_coherent_ties_go_to_the_lower_index():
    ema, sel, step = _state(6)
    kernels.coherent_select(torch.zeros(2, 6), ema, sel, step, keep=2, backend="torch")
    assert sel.tolist() == [True, True, False, False, False, False]


@INTERPRET
@pytest.mark.parametrize("batch,groups,keep", [(1, 1, 1), (4, 2, 1), (16, 112, 56), (3, 130, 129), (2, 8, 8),
                                                (1, 7, None), (5, 70, None), (16, 448, None)])
@pytest.mark.parametrize("memory,refresh", [(0.5, 1), (0.0, 3), (0.9, 2)])
def test_triton_coherent_select_matches_reference(batch, groups, keep, memory, refresh):
    torch.manual_seed(batch * groups)
    margins = [torch.randn(batch, groups) * 2 for _ in range(4)]
    ref = _run("torch", margins, keep, memory, refresh)
    got = _run("triton", margins, keep, memory, refresh)
    for (e1, s1, n1), (e2, s2, n2) in zip(ref, got):
        torch.testing.assert_close(e2, e1, rtol=1e-6, atol=1e-7)
        assert n1 == n2 and torch.equal(s1, s2)


@INTERPRET
@pytest.mark.parametrize("batch,groups", [(1, 7), (5, 70), (16, 448), (3, 2)])
@pytest.mark.parametrize("scale", [0.5, 1.25, 2.0, 16.0])
def test_triton_coherent_keep_scale_matches_reference(batch, groups, scale):
    torch.manual_seed(batch + groups)
    margins = [torch.randn(batch, groups) * 2 for _ in range(3)]

    def run(backend):
        ema, sel, step = _state(groups)
        out = []
        for m in margins:
            kernels.coherent_select(m, ema, sel, step, keep=None, keep_scale=scale, backend=backend)
            out.append(sel.clone())
        return out

    for a, b in zip(run("torch"), run("triton")):
        assert torch.equal(a, b)


@INTERPRET
def test_triton_coherent_ties_and_bf16_margins():
    ema, sel, step = _state(6)
    kernels.coherent_select(torch.zeros(2, 6, dtype=torch.bfloat16), ema, sel, step, keep=2, backend="triton")
    assert sel.tolist() == [True, True, False, False, False, False] and int(step) == 1


def test_coherent_select_rejects_bad_state():
    ema, sel, step = _state(4)
    m = torch.randn(2, 4)
    with pytest.raises(ValueError, match="keep"):
        kernels.coherent_select(m, ema, sel, step, keep=0)
    with pytest.raises(ValueError, match="ema"):
        kernels.coherent_select(m, ema.double(), sel, step, keep=1)
    with pytest.raises(ValueError, match="selection"):
        kernels.coherent_select(m, ema, sel.float(), step, keep=1)
    with pytest.raises(ValueError, match="step"):
        kernels.coherent_select(m, ema, sel, step.int(), keep=1)
    with pytest.raises(ValueError, match="memory"):
        kernels.coherent_select(m, ema, sel, step, keep=1, memory=1.0)
    with pytest.raises(ValueError, match="margin"):
        kernels.coherent_select(m[:0], ema, sel, step, keep=1)
    for bad in (0.0, 17.0, 0.001):
        with pytest.raises(ValueError, match="keep_scale"):
            kernels.coherent_select(m, ema, sel, step, keep=None, keep_scale=bad)
    with pytest.raises(ValueError, match="keep_scale"):
        kernels.coherent_select(m, ema, sel, step, keep=1, keep_scale=1.5)


def test_arrival_counters_grow_without_freeing_what_a_graph_may_hold():
    from wide.kernels.triton import common

    dev = torch.device("cpu")
    first = common.arrival_counters(dev, 10)
    assert first.numel() >= 4096 and not first.any()
    assert common.arrival_counters(dev, 100) is first  # big enough: the same buffer
    bigger = common.arrival_counters(dev, first.numel() + 1)
    assert bigger.numel() > first.numel() and any(t is first for t in common._RETIRED)


@INTERPRET
@pytest.mark.parametrize("batch,groups,rank", [(1, 8, 16), (3, 70, 24), (16, 112, 32), (16, 448, 32), (5, 20, None)])
@pytest.mark.parametrize("keep,memory,refresh,scale",
                         [(None, 0.0, 1, 1.0), (None, 0.5, 2, 1.25), ("half", 0.9, 3, 1.0)])
def test_coherent_route_is_margin_then_select_in_one_launch(batch, groups, rank, keep, memory, refresh, scale):
    """`coherent_route` gives exactly the triton `router_margin` + `coherent_select` pair (same margins, same
    selection, EMA, step and group list) and the reference within float tolerance, step after step."""
    torch.manual_seed(batch * groups)
    D = 96
    down = torch.randn(rank or groups, D) / D**0.5
    up = torch.randn(groups, rank) / rank**0.5 if rank else None
    bias = torch.randn(groups) * 0.1
    keep = groups // 2 if keep == "half" else None
    xs = [torch.randn(batch, 1, D) * 3 for _ in range(4)]

    def run(fused: bool, backend: str):
        ema, sel, step = _state(groups)
        ema.copy_(0.5)
        lists = (torch.zeros(groups, dtype=torch.int32), torch.zeros(1, dtype=torch.int32))
        out = []
        for x in xs:
            kw = dict(keep=keep, memory=memory, refresh_every=refresh, keep_scale=scale, groups=lists)
            if fused:
                kernels.coherent_route(x, down, up, bias, ema=ema, selection=sel, step=step, backend=backend, **kw)
            else:
                m = kernels.router_margin(x.view(batch, D), down, up, bias, decide=False, backend=backend)
                kernels.coherent_select(m, ema, sel, step, backend=backend, **kw)
            out.append((ema.clone(), sel.clone(), int(step), lists[0].clone(), lists[1].clone()))
        return out

    fused, pair, ref = run(True, "triton"), run(False, "triton"), run(True, "torch")
    for (e1, s1, n1, o1, c1), (e2, s2, n2, o2, c2) in zip(fused, pair):
        assert torch.equal(e1, e2) and torch.equal(s1, s2) and n1 == n2 and torch.equal(o1, o2) and torch.equal(c1, c2)
    for (e1, s1, n1, _, _), (e2, s2, n2, _, _) in zip(fused, ref):
        torch.testing.assert_close(e1, e2, rtol=1e-5, atol=1e-6)
        assert n1 == n2


def test_coherent_route_rejects_bad_input():
    ema, sel, step = _state(4)
    down = torch.randn(4, 8)
    with pytest.raises(ValueError, match="x"):
        kernels.coherent_route(torch.randn(2, 3, 8), down, ema=ema, selection=sel, step=step, keep=None)
    with pytest.raises(ValueError, match="ema"):
        kernels.coherent_route(torch.randn(2, 1, 8), down, ema=ema.double(), selection=sel, step=step, keep=None)
    with pytest.raises(ValueError, match="down"):
        kernels.coherent_route(torch.randn(2, 1, 8), torch.randn(4, 7), ema=ema, selection=sel, step=step, keep=None)


@INTERPRET
@pytest.mark.parametrize("rows,d,rank,groups,lowrank,with_bias", [
    (1, 1000, 8, 7, True, True), (3, 3000, 32, 224, True, True),  # the 8B FFN's 224 groups at rank 32: one tile
    (2, 2000, 64, 300, True, False),  # 512 x 64 past the tile cap: the unprefetched path
    (1, 1000, 9, 9, False, True)])    # a linear router (the first stage has the G outputs)
def test_router_prefetch_gives_the_same_margins_bit_for_bit(rows, d, rank, groups, lowrank, with_bias):
    """`KernelOptions.router_prefetch` (the second stage loaded before the arrival atomic) changes where the loads
    sit, not the sums: margins, decisions, the fused norm's output and batch-coherent routing's state equal the
    unprefetched kernel's exactly, and the torch reference's within rounding."""
    from wide.kernels import use_kernel_options

    torch.manual_seed(rows + d + groups)
    x = torch.randn(rows, d) * 2
    down = torch.randn(rank if lowrank else groups, d) / d ** 0.5
    up = torch.randn(groups, rank) / rank ** 0.5 if lowrank else None
    bias = torch.randn(groups) * 0.1 if with_bias else None
    w = torch.rand(d) + 0.5
    got = {}
    for on in (False, True):
        with use_kernel_options(router_prefetch=on):
            ema, sel = torch.full((groups,), 0.5), torch.zeros(groups, dtype=torch.bool)
            step = torch.zeros((), dtype=torch.int64)
            for _ in range(2):  # batch-coherent decode routing: the margins, then the last row's selection
                kernels.coherent_route(x, down, up, bias, ema=ema, selection=sel, step=step, keep=None, memory=0.5,
                                       backend="triton")
            got[on] = (kernels.router_margin(x, down, up, bias, decide=False, backend="triton"),
                       kernels.router_margin(x, down, up, bias, backend="triton"),
                       *kernels.rms_norm_route(x, w, 1e-5, down, up, bias, backend="triton"), ema, sel, step)
    for a, b in zip(got[False], got[True]):
        assert torch.equal(a, b)
    ref = kernels.router_margin(x, down, up, bias, decide=False, backend="torch")
    torch.testing.assert_close(got[True][0], ref, rtol=1e-4, atol=1e-5)
