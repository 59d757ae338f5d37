import pytest
import torch

from wide.kernels import RoutingPlan, make_plan


@pytest.mark.parametrize("shape", [(1, 1, 1), (1, 9, 4), (2, 7, 3), (3, 33, 5), (40, 4)], ids=str)
@pytest.mark.parametrize("density", [0.0, 0.4, 1.0])
def test_token_order_is_a_stable_partition(shape, density):
    gen = torch.Generator().manual_seed(0)
    mask = torch.rand(shape, generator=gen) < density
    plan = make_plan(mask)
    for flat in ([True, False] if mask.dim() == 3 else [True]):
        perm, counts = plan.token_order(flat)
        m = mask.reshape(1, -1, mask.shape[-1]) if flat else mask
        assert perm.dtype == torch.int32 and counts.dtype == torch.int32 and perm.is_contiguous()
        for r in range(m.shape[0]):
            for g in range(m.shape[-1]):
                active = torch.nonzero(m[r, :, g]).view(-1)
                inactive = torch.nonzero(~m[r, :, g]).view(-1)
                assert counts[r, g] == active.numel()
                assert torch.equal(perm[r, g].long(), torch.cat([active, inactive]))


def test_one_row_builds_one_order_for_both_uses():
    mask = torch.rand(1, 9, 4, generator=torch.Generator().manual_seed(1)) < 0.5
    plan = make_plan(mask)
    assert plan.token_order(False)[0] is plan.token_order(True)[0]  # q (flat) and attention (rows): one launch
    two = make_plan(torch.cat([mask, ~mask]))
    assert two.token_order(False)[0].shape == (2, 4, 9) and two.token_order(True)[0].shape == (1, 4, 18)


def test_group_list_and_cache():
    mask = torch.zeros(5, 6, dtype=torch.bool)
    mask[0, 4] = mask[3, 1] = mask[2, 4] = True
    plan = make_plan(mask)
    order, n = plan.group_list()
    assert n.tolist() == [2] and order[:2].tolist() == [1, 4] and sorted(order.tolist()) == list(range(6))
    assert plan.group_list()[0] is order  # cached: paired ops reuse it
    assert plan.materialize() is plan and plan.matches(mask) and not plan.matches(mask.clone())


def test_plan_rejects_float_and_wrong_rank():
    with pytest.raises(TypeError, match="bool"):
        RoutingPlan(torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"\[B, T, G\]"):
        make_plan(torch.ones(4, 3, dtype=torch.bool)).token_order(flat=False)


@pytest.mark.skipif(not __import__("os").environ.get("TRITON_INTERPRET"), reason="interpreter check")
@pytest.mark.parametrize("shape", [(1, 300, 3), (2, 17, 5), (3, 1, 2), (1, 112, 1), (1, 8, 1), (1, 1, 1)], ids=str)
def test_triton_partition_matches_torch(shape):
    from wide.kernels.plan import _stable_partition
    from wide.kernels.triton.partition import partition

    mask = torch.rand(shape, generator=torch.Generator().manual_seed(3)) < 0.4
    perm, counts = partition(mask)
    ref_perm, ref_counts = _stable_partition(mask)
    assert torch.equal(perm, ref_perm) and torch.equal(counts, ref_counts)


@pytest.mark.skipif(not __import__("os").environ.get("TRITON_INTERPRET"), reason="interpreter check")
@pytest.mark.parametrize("shape", [(1, 8), (16, 112), (3, 1), (40, 300), (0, 5), (1, 1)], ids=str)
@pytest.mark.parametrize("density", [0.0, 0.05, 0.5, 1.0])
def test_triton_group_list_matches_torch(shape, density):
    from wide.kernels.plan import _stable_partition
    from wide.kernels.triton.partition import group_list

    mask = torch.rand(shape, generator=torch.Generator().manual_seed(5)) < density
    order, n = group_list(mask)
    ref_perm, ref_n = _stable_partition(mask.any(0).view(1, -1, 1))
    assert order.dtype == n.dtype == torch.int32
    assert torch.equal(order, ref_perm.view(-1)) and torch.equal(n, ref_n.view(1))
    strided = torch.rand(shape[1], max(shape[0], 1)).lt(density).t()[: shape[0]]  # a transposed (strided) mask
    order, n = group_list(strided)
    ref_perm, ref_n = _stable_partition(strided.any(0).view(1, -1, 1))
    assert torch.equal(order, ref_perm.view(-1)) and torch.equal(n, ref_n.view(1))


def test_density_hint_is_used_without_reading_the_mask(monkeypatch):
    from wide.kernels.plan import RoutingPlan

    mask = torch.rand(3, 5, 4) < 0.5
    plan = make_plan(mask, density_hint=0.5)

    def no_sync(self):
        raise AssertionError("measured the density on the host")

    monkeypatch.setattr(RoutingPlan, "density", no_sync)
    assert plan.expected_density() == 0.5
    assert plan.known_all_active() is False  # a hint never licenses skipping a masking pass
    with pytest.raises(ValueError, match="density_hint"):
        make_plan(mask, density_hint=1.5)


@pytest.mark.parametrize("hint", [None, 0.0, 1.0])
@pytest.mark.parametrize("all_on", [False, True])
def test_density_hint_changes_the_path_never_the_result(monkeypatch, hint, all_on):
    """A wrong hint (dense path for a sparse mask, routed for a full one) still gives exact results."""
    from wide import kernels
    from wide.kernels.triton import gemm_k, gemm_mn

    monkeypatch.setattr(gemm_mn, "DENSE_MIN_M", 8)
    monkeypatch.setattr(gemm_k, "K_PREMASK_MIN_M", 8)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 9, 32, generator=g)
    w_gate, w_up = torch.randn(64, 32, generator=g), torch.randn(64, 32, generator=g)
    w_down = torch.randn(32, 64, generator=g)
    mask = torch.ones(2, 9, 4, dtype=torch.bool) if all_on else torch.rand(2, 9, 4, generator=g) < 0.5
    plan = make_plan(mask, density_hint=hint)
    h = kernels.swiglu(x, w_gate, w_up, mask, plan=plan, backend="triton")
    y = kernels.gemm_k(h, w_down, mask, plan=plan, backend="triton")
    y2 = kernels.gemm_k(x @ w_gate.t(), w_down, mask, plan=plan, backend="triton")
    ref_h = kernels.swiglu(x, w_gate, w_up, mask, backend="torch")
    torch.testing.assert_close(h, ref_h, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(y, kernels.gemm_k(ref_h, w_down, mask, backend="torch"), atol=1e-3, rtol=1e-4)
    torch.testing.assert_close(y2, kernels.gemm_k(x @ w_gate.t(), w_down, mask, backend="torch"), atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("hint, path", [(1.0, "dense"), (0.5, "routed"), (None, "routed")])
def test_hinted_plan_picks_the_dense_path_under_stream_capture(monkeypatch, hint, path):
    """Under capture a plan may not read its mask on the host: with a density hint the high-density path
    (cuBLAS + masking pass) is still chosen, without one the routed kernel runs (no sync either way)."""
    from wide import kernels
    from wide.kernels.triton import gemm_mn

    monkeypatch.setattr(gemm_mn, "DENSE_MIN_M", 8)
    monkeypatch.setattr(gemm_mn, "capturing", lambda t: True)

    def no_sync(self):
        raise AssertionError("measured the density on the host while capturing")

    monkeypatch.setattr(RoutingPlan, "density", no_sync)
    used = []
    real_dense = gemm_mn.gemm_mn_dense
    monkeypatch.setattr(gemm_mn, "gemm_mn_dense", lambda *a, **k: used.append("dense") or real_dense(*a, **k))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(16, 32, generator=g)
    w = torch.randn(512, 32, generator=g)  # groups of 128: the dense path above 75% expected density
    mask = torch.rand(16, 4, generator=g) < 0.7
    out = kernels.gemm_mn(x, w, mask, plan=make_plan(mask, density_hint=hint), backend="triton")
    torch.testing.assert_close(out, kernels.gemm_mn(x, w, mask, backend="torch"), atol=1e-4, rtol=1e-4)
    assert used == (["dense"] if path == "dense" else [])


@pytest.mark.parametrize("M,G,block", [(1, 1, 16), (37, 5, 16), (64, 3, 32), (70, 70, 16)], ids=str)
@pytest.mark.parametrize("kind", ["off", "on", "random", "patterns"])
def test_tile_order_lists_each_tiles_needed_groups(M, G, block, kind):
    gen = torch.Generator().manual_seed(M * G)
    if kind == "patterns":  # few distinct rows: sorting must put equal rows together
        pats = torch.rand(3, G, generator=gen) < 0.5
        mask = pats[torch.randint(0, 3, (M,), generator=gen)]
    else:
        mask = torch.rand(M, G, generator=gen) < {"off": 0.0, "on": 1.1, "random": 0.5}[kind]
    plan = make_plan(mask.view(1, M, G))
    rows, tile_list, tile_count = plan.tile_order(block)
    n_tiles = -(-M // block)
    assert rows.dtype == tile_list.dtype == tile_count.dtype == torch.int32
    assert sorted(rows.tolist()) == list(range(M))  # a permutation of the tokens
    assert tile_list.shape == (n_tiles, G) and tile_count.shape == (n_tiles,)
    for i in range(n_tiles):
        need = mask[rows[i * block:(i + 1) * block].long()].any(0)
        expect = torch.cat([torch.nonzero(need).view(-1), torch.nonzero(~need).view(-1)])
        assert tile_count[i] == int(need.sum()) and torch.equal(tile_list[i].long(), expect)
    share = plan.tile_share(block)
    assert share == pytest.approx(float(tile_count.sum()) / (n_tiles * G))
    assert plan.tile_order(block)[0] is rows  # cached per block size
    if kind == "patterns":  # sorted, each pattern occupies one run of rows: at most one mixed tile per boundary
        runs = sum(1 for i in range(1, M) if not torch.equal(mask[rows[i]], mask[rows[i - 1]]))
        assert runs <= 2
    if kind in ("off", "on"):
        assert share == (0.0 if kind == "off" else 1.0)


def test_tile_order_rejects_bad_block():
    with pytest.raises(ValueError, match="block_m"):
        make_plan(torch.ones(4, 3, dtype=torch.bool)).tile_order(0)


@pytest.mark.parametrize("kind, path, hint", [("patterns", "sorted", None), ("patterns", "sorted", 0.3),
                                              ("patterns", "premask", 0.9), ("random", "premask", None),
                                              ("on", "premask", None)])
@pytest.mark.parametrize("capturing", [False, True])
def test_large_m_gemm_k_takes_the_sorted_tiles_for_structured_masks(monkeypatch, kind, path, hint, capturing):
    """Where the dense path would run, masks whose sorted tiles need few groups take gemm_k_sorted instead
    (decided from one host read of the plan); random or full masks, a density hint above the threshold (the
    tiles are then not even sorted), and any call under capture stay dense."""
    from wide import kernels
    from wide.kernels.triton import gemm_k
    from wide.kernels.triton.common import GemmConfig

    monkeypatch.setattr(gemm_k, "default_k_config", lambda M, N, K, group, options=None, colmajor=False: GemmConfig(
        16, 16, 16, variant="premask"))
    monkeypatch.setattr(gemm_k, "K_SORTED_MIN_M", 64)
    monkeypatch.setattr(gemm_k, "capturing", lambda t: capturing)
    used = []
    real = gemm_k.gemm_k_sorted
    monkeypatch.setattr(gemm_k, "gemm_k_sorted", lambda *a, **k: used.append("sorted") or real(*a, **k))
    g = torch.Generator().manual_seed(2)
    G, M = 8, 96
    if kind == "patterns":  # two kinds of token, each running 2 of 8 groups
        pats = torch.zeros(2, G, dtype=torch.bool)
        pats[0, :2] = pats[1, 5:7] = True
        mask = pats[torch.randint(0, 2, (M,), generator=g)]
    else:
        mask = torch.rand(M, G, generator=g) < (0.5 if kind == "random" else 1.1)
    x, w, b = torch.randn(M, G * 16, generator=g), torch.randn(24, G * 16, generator=g), torch.randn(24, generator=g)
    plan = make_plan(mask, density_hint=hint)
    out = kernels.gemm_k(x, w, mask, bias=b, plan=plan, backend="triton")
    torch.testing.assert_close(out, kernels.gemm_k(x, w, mask, bias=b, backend="torch"), atol=1e-4, rtol=1e-4)
    assert used == (["sorted"] if path == "sorted" and not capturing else [])
    if hint == 0.9:
        assert not any(k.startswith("tiles") for k in plan._cache)  # not sorted at all
    if kind == "patterns":
        assert plan.tile_share(16) <= 0.25 + 1 / 6  # 6 tiles, at most one mixed


@pytest.mark.parametrize("density, hint, capturing, path", [
    (1.1, None, False, "dense"),  # all on, measured: SDPA output copied, no masking pass
    (0.9, None, False, "dense"),  # measured density above the threshold: SDPA, inactive heads zeroed
    (0.5, None, False, "routed"),
    (0.5, 1.0, True, "dense"),  # a (wrong) hint under capture: the path changes, never the result
    (1.1, None, True, "routed"),  # no hint under capture: no host read, the routed kernel
])
def test_prefill_attention_runs_sdpa_for_dense_masks(monkeypatch, density, hint, capturing, path):
    from wide import kernels
    from wide.kernels.triton import attention as ta

    monkeypatch.setattr(ta, "PREFILL_DENSE_MIN_T", 8)
    monkeypatch.setattr(ta, "capturing", lambda t: capturing)
    if capturing:
        def no_sync(self):
            raise AssertionError("measured the density on the host while capturing")

        monkeypatch.setattr(RoutingPlan, "density", no_sync)
    used = []
    real = ta.attention_prefill_dense
    monkeypatch.setattr(ta, "attention_prefill_dense", lambda *a, **k: used.append(a[-1]) or real(*a, **k))
    g = torch.Generator().manual_seed(3)
    B, T, HQ, HK, D = 2, 24, 8, 2, 16
    q = torch.randn(B, T, HQ, D, generator=g)
    k, v = torch.randn(B, HK, T, D, generator=g).transpose(1, 2), torch.randn(B, T, HK, D, generator=g)
    mask = torch.rand(B, T, HQ // 2, generator=g) < density
    out = kernels.attention_prefill(q, k, v, mask, plan=make_plan(mask, density_hint=hint), backend="triton")
    ref = kernels.attention_prefill(q, k, v, mask, backend="torch")
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert bool(used) == (path == "dense")
    if used:  # the masking pass is skipped only when every head is known to run
        assert used == [density > 1 and hint is None]


@pytest.mark.parametrize("hint, listed", [(None, True), (0.5, True), (0.95, False), (1.0, False)])
def test_near_dense_decode_gemm_k_builds_no_group_list(monkeypatch, hint, listed):
    """At decode, gemm_k walks the plan's needed-group list (built by one extra launch); a plan whose density
    hint is at least K_LIST_MAX_HINT takes the affine loop instead, with no list, and the same result."""
    from wide import kernels
    from wide.kernels.triton import gemm_k
    from wide.kernels.triton.common import GemmConfig

    monkeypatch.setattr(gemm_k, "default_k_config", lambda M, N, K, group, options=None, colmajor=False: GemmConfig(
        1, 16, 16, variant="list"))
    built = []
    real = RoutingPlan.group_list
    monkeypatch.setattr(RoutingPlan, "group_list", lambda self: built.append(1) or real(self))
    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(1, 64, generator=g), torch.randn(24, 64, generator=g)
    mask = torch.rand(1, 4, generator=g) < 0.6
    out = kernels.gemm_k(x, w, mask, plan=make_plan(mask, density_hint=hint), backend="triton")
    torch.testing.assert_close(out, kernels.gemm_k(x, w, mask, backend="torch"), atol=1e-4, rtol=1e-4)
    assert bool(built) == listed


@pytest.mark.parametrize("M", [1, 5, 16, 19])
@pytest.mark.parametrize("fill", ["none", "all", "random"])
@pytest.mark.parametrize("split, block_n", [(1, 16), (3, 16), (1, 8)])
def test_tile_group_list_gemm_k_matches_reference(monkeypatch, M, fill, split, block_n):
    """The "local" gemm_k variant (each program compacts its tile's needed groups itself, no plan list, no
    launch before it) equals the reference for masks with no, every or some groups on, with split-K and without
    (narrow N tiles: the GEMV sweep's split-1 candidates), over a group count that is not a power of two and an N
    that is no multiple of 16."""
    from wide import kernels
    from wide.kernels.triton.common import GemmConfig

    built = []
    real = RoutingPlan.group_list
    monkeypatch.setattr(RoutingPlan, "group_list", lambda self: built.append(1) or real(self))
    g = torch.Generator().manual_seed(M * 10 + split)
    ng, group = 7, 16
    x, w = torch.randn(M, ng * group, generator=g), torch.randn(44, ng * group, generator=g)
    mask = {"none": torch.zeros(M, ng, dtype=torch.bool), "all": torch.ones(M, ng, dtype=torch.bool),
            "random": torch.rand(M, ng, generator=g) < 0.4}[fill]
    cfg = GemmConfig(1 if M == 1 else 16, block_n, 16, split_k=split, variant="local")
    from wide.kernels import get_backend

    out = get_backend("triton").gemm_k(x, w, mask, config=cfg)
    torch.testing.assert_close(out, kernels.gemm_k(x, w, mask, backend="torch"), atol=1e-4, rtol=1e-4)
    assert not built


def test_rows_shared_and_given_group_list():
    """A broadcast row (batch-coherent decode's ``selection.expand``) is recognised from its layout; a plan given
    the group list returns it and builds none."""
    sel = torch.tensor([True, False, True, False, False])
    shared = make_plan(sel.expand(4, 1, 5))
    assert shared.rows_shared and make_plan(sel.view(1, 1, 5)).rows_shared
    assert not make_plan(sel.expand(4, 1, 5).contiguous()).rows_shared
    order, n = torch.tensor([0, 2, 1, 3, 4], dtype=torch.int32), torch.tensor([2], dtype=torch.int32)
    plan = make_plan(sel.expand(4, 1, 5), group_list=(order, n))
    assert plan.built("groups") and plan.group_list()[0] is order
    with pytest.raises(ValueError, match="group_list"):
        make_plan(sel.expand(4, 1, 5), group_list=(order[:3], n))


@pytest.mark.parametrize("rows, shared, listed", [(16, False, False), (16, True, True), (2, False, True)])
def test_decode_gemm_k_lists_only_when_rows_leave_groups_out(monkeypatch, rows, shared, listed):
    """At 50%, 16 independent rows need ~every group (1 - 0.5^16): gemm_k takes the affine loop and builds no
    list; rows sharing one mask (coherent decode) or few rows keep the list."""
    from wide import kernels
    from wide.kernels.triton import gemm_k
    from wide.kernels.triton.common import GemmConfig

    monkeypatch.setattr(gemm_k, "default_k_config", lambda M, N, K, group, options=None, colmajor=False: GemmConfig(
        16, 16, 16, variant="list"))
    built = []
    real = RoutingPlan.group_list
    monkeypatch.setattr(RoutingPlan, "group_list", lambda self: built.append(1) or real(self))
    g = torch.Generator().manual_seed(rows)
    x, w = torch.randn(rows, 64, generator=g), torch.randn(24, 64, generator=g)
    mask = (torch.rand(1, 4, generator=g) < 0.5).expand(rows, 4) if shared else torch.rand(rows, 4, generator=g) < 0.5
    out = kernels.gemm_k(x, w, mask, plan=make_plan(mask, density_hint=0.5), backend="triton")
    torch.testing.assert_close(out, kernels.gemm_k(x, w, mask, backend="torch"), atol=1e-4, rtol=1e-4)
    assert bool(built) == listed
