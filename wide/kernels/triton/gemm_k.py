"""Reduction-width routed GEMM (`gemm_k`) on Triton: the host function that picks the path, its configs and
heuristics, and the launchers of the kernels in `wide.kernels.triton.gemm_k_kernels`.

Paths (`gemm_k` picks one per call from M, K, the group size and the plan):
- ``direct``: natural-order token tiles whose K loop is affine (loads of unused groups masked off), walks the
  plan's needed-group list (``"list"``) or a list each program builds itself (``"local"``): decode sizes;
- ``dense`` (``"premask"``, large M): one masking pass + cuBLAS (with independent masks every tile needs every
  group), skipped where x is known to be masked already;
- ``sorted`` (from `K_SORTED_MIN_M`, structured masks): the plan's pattern-sorted tokens, each tile walking its
  own needed groups, where those tiles need few enough of their groups (one host read per plan, eager only).
"""

from __future__ import annotations

import dataclasses

import torch
import triton

from ..options import KernelOptions, kernel_options
from ..plan import RoutingPlan, plan_for
from .common import (GemmConfig, arrival_counters, capturing, column_major, for_element_size, interpreting, pow2_divisor,
                     rows_and_out)
from .gemm_k_kernels import _gemm_k_kernel, _gemm_k_sorted_kernel, _mask_columns_kernel

# gemm_k above this M goes dense: with independent masks every tile needs every group (see NOTES)
K_PREMASK_MIN_M = 512
# ... unless the plan's pattern-sorted tiles need at most this share of their (tile, group) pairs, and M is
# at least K_SORTED_MIN_M: then gemm_k_sorted. H200, 2026-12-01 (benchmarks/kernel_table.py --ops gemm_k_sorted,
# down_proj shape): its time is ≈ 1.6 x share x cuBLAS's at M=16384 (share 0.48: 1.34x, 0.52: 1.20x) and
# ≈ 1.6-1.9 x at M=4096 (0.48: 1.10x, 0.62: 0.99x), while building the sorted plan (argsort, gather,
# partition, one host read) took 0.35-0.65 ms eagerly: a clear net win at 16384 (0.67 ms saved), none at
# 4096 (0.06 ms). 8192 lies between, untimed. Independent random masks never qualify (every tile needs
# every group).
K_SORTED_MAX_SHARE = 0.55
K_SORTED_MIN_M = 8192


def default_k_config(M: int, N: int, K: int, group: int, options: KernelOptions | None = None,
                     colmajor: bool = False) -> GemmConfig:
    """The gemm_k config (H200-tuned); ``options`` (default: the current `kernel_options`) may switch the
    transposed decode tiles off; ``colmajor``: the weight is stored column-major (`column_major`)."""
    options = options or kernel_options()
    if interpreting():
        return GemmConfig(1 if M == 1 else 16, 16, pow2_divisor(K, 32))
    if colmajor and M <= 32:
        return _colmajor_decode_config(M, K, group, listed=True)
    bk = pow2_divisor(K, 128)  # the affine loop takes chunks spanning several narrow groups
    if M == 1:
        if group >= 128:
            # GEMV: the compacted group list wastes no loop trips on skipped groups (run 3: 16.3 us, 1.92x;
            # narrow groups make its chunks too small: 32-wide 44.9 us)
            # (2026-11-30 sweep, no L2 reuse: 8 warps 7.8 / 18.8 us for o / down at 50% vs 8.5 / 19.8 with 4)
            # ("local": each program builds the list from the mask row itself, no launch before the GEMV)
            return GemmConfig(1, 32, pow2_divisor(group, 128), num_warps=8, num_stages=4, split_k=4,
                              variant="local")
        return GemmConfig(1, 32, bk, num_warps=4, num_stages=4, split_k=4)
    if M <= 32:  # chunks inside one group: uniform masks along K keep the loads vectorized
        # the transposed tile (swap, wgmma over 64 weight rows): 2026-12-01 sweep at M=16, coherent 50%: o 8.6 us,
        # down 19.3 (list, 5 stages) vs 10.1 / 20.6 with 16 x 32 row tiles (split 8 for down)
        if not options.skinny_swap:  # the row tiles (2026-11-30 sweep)
            if group >= 128:
                return GemmConfig(16, 32, pow2_divisor(group, 128), num_warps=4, num_stages=4,
                                  split_k=8 if K >= 8192 else 4, variant="list")
            return GemmConfig(16, 64, pow2_divisor(group, 128), num_warps=4, num_stages=4, split_k=4)
        if group >= 128:
            # the needed-group list (the union of the rows' groups): batch-coherent decode masks skip half the
            # loop (2026-11-30 sweep at M=16, 50%: list 10.0 / 20.7 us vs affine 11.1 / 23.8 for o / down).
            # The plan's list, not "local": building it in each program cost more than its launch
            # (2026-12-01, down at 50%: 31.6 us local vs 21.0 list)
            return GemmConfig(16, 64, pow2_divisor(group, 128), num_warps=4, num_stages=5, split_k=4,
                              variant="list", swap=True)
        bk = pow2_divisor(group, 128)
        return GemmConfig(16, 64, bk, num_warps=4, num_stages=4, split_k=4, swap=bk >= 64)
    if M < K_PREMASK_MIN_M:
        return GemmConfig(64, 128, pow2_divisor(group, 64), num_warps=4, num_stages=4, split_k=4)
    return GemmConfig(128, 128, 64, variant="premask")


# decode gemm_k walks a needed-group list (the plan's costs a launch to build) unless the groups some row needs,
# expected from the plan's density hint, are at least this share: near full density the list skips no loop
# trips, and the affine loop was the faster config anyway (H200 sweep, 2026-12-01, M=1 at 100%: o 11.7 us
# affine / 12.0 list, down 31.5 / 32.2 — the list timed without its launch; at 50% the list wins, 8.1 / 18.7
# against 19.9 affine for down; M=16 per-token 50%, where 16 rows need ~every group: down 32.3 affine / 34.4 list)
K_LIST_MAX_HINT = 0.9


# Decode gemm_k over column-major weights (`column_major`), by (rows: 1 or more, wide groups of >= 512 channels such
# as o_proj's head groups): the tile's weight rows are input channels, contiguous along N, and the splits share the
# active groups' chunks. Batch 1: the winners of `benchmarks/gemv_sweep.py --colmajor --half-only` on an H100
# (2026-12-07, 50% masks, 8B o_proj and down_proj): still slower than the row-major default (o_proj 11.5 against
# 9.6 us, down_proj 27.2 against 25.3), so row-major stays the default layout. Batch 16: first guesses, not swept
# (`--m 16`; `benchmarks/with_configs.py F` runs a command with a sweep's best in this table).
COLMAJOR_DECODE = {
    (1, True): GemmConfig(1, 64, 64, num_warps=4, num_stages=4, split_k=16, variant="local"),
    (1, False): GemmConfig(1, 64, 64, num_warps=4, num_stages=4, split_k=16, variant="local"),
    (16, True): GemmConfig(16, 128, 32, num_warps=4, num_stages=4, split_k=4, variant="list"),
    (16, False): GemmConfig(16, 128, 32, num_warps=4, num_stages=4, split_k=4, variant="list"),
}


def _colmajor_decode_config(M: int, K: int, group: int, listed: bool) -> GemmConfig:
    """`COLMAJOR_DECODE`'s config for this call, its K chunk cut to the group (a chunk spanning narrow groups takes
    the affine loop's per-column decisions); ``listed=False``: the affine loop (no group list)."""
    cfg = COLMAJOR_DECODE[(1 if M == 1 else 16, group >= 512)]
    bk = pow2_divisor(group, cfg.block_k)
    if bk < (16 if M > 1 else 8):  # narrow or odd groups: chunks across groups (tl.dot takes K >= 16)
        bk = pow2_divisor(K, cfg.block_k)
    variant = cfg.variant if listed and group % bk == 0 else ""
    if variant == "local" and M > 1:
        variant = "list"
    return dataclasses.replace(cfg, block_k=bk, variant=variant, swap=cfg.swap and group % bk == 0)


def affine_k_config(M: int, N: int, K: int, group: int, options: KernelOptions | None = None,
                    colmajor: bool = False) -> GemmConfig:
    """The decode gemm_k config with no group list (dense-ish masks): the sweep's best at full density."""
    options = options or kernel_options()
    if interpreting():
        return GemmConfig(1 if M == 1 else 16, 16, pow2_divisor(K, 32))
    if colmajor:
        return _colmajor_decode_config(M, K, group, listed=False)
    if M == 1:
        return GemmConfig(1, 32, pow2_divisor(K, 128), num_warps=8, num_stages=4, split_k=4)
    bk = pow2_divisor(group, 128)
    if bk < 64 or not options.skinny_swap:  # narrow groups: chunks across groups (per-column decisions), row tiles
        return GemmConfig(16, 64, pow2_divisor(K, 128), num_warps=4, num_stages=4, split_k=8 if K >= 8192 else 4)
    # the transposed tile (2026-12-01 sweep, M=16 all on: o 12.3 us, down 32.1 vs 12.9 / 32.4 with 16 x 64 row tiles)
    return GemmConfig(16, 64, bk, num_warps=4, num_stages=4, split_k=4, swap=True)


def sorted_k_config(M: int, N: int, K: int, group: int) -> GemmConfig | None:
    """Config of gemm_k_sorted, or ``None`` where its tiles cannot be cut (group not a multiple of 16)."""
    if group % 16:
        return None
    if interpreting():
        return GemmConfig(16, 16, pow2_divisor(group, 32), variant="sorted")
    return GemmConfig(128, 128, pow2_divisor(group, 64), num_warps=8, num_stages=3, variant="sorted")

def gemm_k(x, weight, mask, bias, plan: RoutingPlan | None, out, x_masked: bool, config: GemmConfig | None = None,
           options: KernelOptions | None = None, residual: torch.Tensor | None = None) -> torch.Tensor:
    """Routed reduction-width GEMM ``(x * mask expanded) @ weight^T (+ bias)``: picks the path and its config,
    then launches it.

    Args:
        x: ``[..., K]``; weight: ``[N, K]``; mask: ``[..., K/G]`` bool; bias: ``[N]`` or ``None``.
        plan: the mask's routing plan or ``None``; out: ``[..., N]`` or ``None``.
        x_masked: x is already zero in masked groups (the output of gemm_mn/SwiGLU under this mask).
        config: an explicit config (its variant is the path); ``None``: `default_k_config`, then the sorted or
            affine variant where the plan says so.
        options: the A/B switches of the default configs (``None``: the current `kernel_options`).
        residual: ``[..., N]`` added to the result (the direct path in its epilogue, to the rounded projection:
            the bits of a separate add; the large-M paths after).
    """
    K = x.shape[-1]
    N = weight.shape[0]
    ng = mask.shape[-1]
    x2, out = rows_and_out(x, N, out)
    M = x2.shape[0]
    if M == 0:
        return out
    plan = plan_for(mask, plan)
    if config is None:
        from . import experts as ex_host  # (imports this module)

        if ex_host.use_gemm_k_experts(x, weight, mask, plan, options):
            # wide groups (o_proj over whole KV-head units) at prefill: `KernelOptions.gemm_k_experts`
            return ex_host.gemm_k_experts(x, weight, mask, bias, plan, out, residual)
    colmajor = column_major(weight)
    cfg = config if config is not None else for_element_size(
        default_k_config(M, N, K, K // ng, options, colmajor), x.element_size())
    if config is None and cfg.variant == "premask" and M >= K_SORTED_MIN_M and not capturing(x):
        # structured masks: the pattern-sorted tiles may need few enough groups to beat the dense path (one
        # host read per plan, prefill only; under capture the dense path stays). No tile needs fewer pairs
        # than its tokens run, so a denser mask never qualifies and is not even sorted.
        sorted_cfg = sorted_k_config(M, N, K, K // ng)
        sorted_cfg = sorted_cfg and for_element_size(sorted_cfg, x.element_size())
        if sorted_cfg is not None and plan.expected_density() <= K_SORTED_MAX_SHARE and \
                plan.tile_share(sorted_cfg.block_m) <= K_SORTED_MAX_SHARE:
            cfg = sorted_cfg
    if config is None:
        cfg = _listless(cfg, plan, M, N, K, ng, options, x.element_size(), colmajor)
    mask2 = mask.reshape(-1, ng).view(torch.uint8)
    if cfg.variant == "sorted":
        rows, tile_list, tile_count = plan.tile_order(cfg.block_m)
        gemm_k_sorted(x2, weight, bias, out.view(-1, N), mask2, rows, tile_list, tile_count, K // ng, cfg,
                      x_masked=x_masked)
        return out if residual is None else out.add_(residual)
    if cfg.variant == "premask":
        if not x_masked and not capturing(x):
            # an all-true mask makes the masking pass a copy: skip it (one host sync per plan, prefill only)
            x_masked = plan.known_all_active()
        gemm_k_dense(x2, weight, bias, out.view(-1, N), mask2, K // ng, x_masked=x_masked)
        return out if residual is None else out.add_(residual)
    glist = nlist = None  # "local" builds its tiles' lists in the kernel; the others read none
    if cfg.variant == "list":
        glist, nlist = plan.group_list()
    gemm_k_direct(x2, weight, bias, out.view(-1, N), mask2, glist, nlist, K // ng, cfg, x_masked=x_masked,
                  residual=None if residual is None else residual.reshape(-1, N))
    return out


def _listless(cfg: GemmConfig, plan: RoutingPlan, M: int, N: int, K: int, ng: int, options, element_size: int,
              colmajor: bool = False):
    """``cfg``, or the affine decode config where a group list would skip (nearly) nothing."""
    if cfg.variant in ("list", "local") and plan.density_hint is not None and not plan.built("groups"):
        # the share of groups some row of the call needs: the rate itself when the rows share one mask
        # (batch-coherent decode), else that of independent rows (at 50%, 16 rows need ~all groups)
        need = plan.density_hint if plan.rows_shared else 1.0 - (1.0 - plan.density_hint) ** M
        if need >= K_LIST_MAX_HINT:
            # (nearly) every group: a list would skip nothing (and the plan's costs a launch)
            return for_element_size(affine_k_config(M, N, K, K // ng, options, colmajor), element_size)
    return cfg


def gemm_k_route(x, weight, mask, residual, norm_weight, norm_eps: float, down, up, bias, normalize: bool,
                 eps: float, plan: RoutingPlan | None = None, x_masked: bool = False,
                 config: GemmConfig | None = None):
    """One decode row: ``h = residual + (x * mask expanded) @ weight^T``, then the HF RMSNorm of ``h`` and the
    router's decisions on ``h`` (`rms_norm_route`), all in one `_gemm_k_kernel` launch (its ``ROUTE`` epilogue);
    see `wide.kernels.gemm_k_route`. Returns ``(h, y, decisions)``."""
    K = x.shape[-1]
    N = weight.shape[0]
    ng = mask.shape[-1]
    x2 = x.reshape(-1, K)
    if x2.shape[0] != 1:
        raise ValueError(f"gemm_k_route (triton): one row per launch, got {x2.shape[0]}")
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    G = up.shape[0] if up is not None else down.shape[0]
    h = torch.empty(*x.shape[:-1], N, device=x.device, dtype=x.dtype)
    y = torch.empty_like(h)
    dec = torch.empty(*x.shape[:-1], G, device=x.device, dtype=torch.bool)
    plan = plan_for(mask, plan)
    cfg = config
    if cfg is None:
        colmajor = column_major(weight)
        cfg = _listless(for_element_size(default_k_config(1, N, K, K // ng, None, colmajor), x.element_size()), plan,
                        1, N, K, ng, None, x.element_size(), colmajor)
    glist = nlist = None
    if cfg.variant == "list":
        glist, nlist = plan.group_list()
    gemm_k_direct(x2, weight, None, h.view(1, N), mask.reshape(1, ng).view(torch.uint8), glist, nlist, K // ng, cfg,
                  x_masked=x_masked, residual=residual.reshape(1, N),
                  route=(down, up, bias, normalize, eps, norm_weight, norm_eps, y.view(N), dec.view(G)))
    return h, y, dec


def _split_k_buffers(x, out, cfg: GemmConfig, workspace, unused):
    """(split, output tiles, fp32 workspace, arrival counters) of a gemm_k launch; without split-K the
    workspace and counter arguments are never read, so ``out`` and ``unused`` stand in for them."""
    M, N = out.shape
    split = max(1, cfg.split_k)
    tiles = triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n)
    if split == 1:
        return split, tiles, out, unused
    if workspace is None or workspace.numel() < split * M * N:
        workspace = torch.empty(split * M * N, device=x.device, dtype=torch.float32)
    return split, tiles, workspace, arrival_counters(x.device, tiles)


def gemm_k_direct(x, weight, bias, out, mask, glist, nlist, group: int, config: GemmConfig,
                  workspace: torch.Tensor | None = None, x_masked: bool = False,
                  residual: torch.Tensor | None = None, route: tuple | None = None) -> torch.Tensor:
    """Routed reduction-width GEMM over token tiles in natural order: ``out = (x * mask expanded) @ weight^T
    (+ bias)``.

    Args:
        x: ``[M, K]``; weight: ``[N, K]``; bias: ``[N]`` or ``None``; out: ``[M, N]``.
        mask: ``[M, G_count]`` uint8 view of the bool mask.
        glist: ``[G_count]`` int32 groups some token needs, first (the plan's order); nlist: ``[1]`` int32
            (only read by the ``"list"`` variant; the ``"local"`` variant builds each tile's list in the kernel
            and takes ``None`` for both).
        x_masked: x is already zero in masked groups (the output of gemm_mn/SwiGLU under this mask).
        residual: ``[M, N]`` or ``None``, added in the epilogue to the rounded projection (a separate add's bits).
        route: `gemm_k_route`'s ``(down, up, bias, normalize, eps, norm_weight, norm_eps, y [N], decisions [G])``
            (one row): the written row's norm and router decisions in the same launch.
    """
    M, K = x.shape
    N = weight.shape[0]
    cfg = config
    listed = cfg.variant in ("list", "local")
    if cfg.variant not in ("", "list", "local"):
        raise ValueError(f"variant={cfg.variant!r} is not a gemm_k_direct variant (gemm_k picks its launcher)")
    if listed and group % cfg.block_k:
        raise ValueError(f"block_k={cfg.block_k} must divide the group size {group} ({cfg.variant} variant)")
    if K % cfg.block_k:
        raise ValueError(f"block_k={cfg.block_k} must divide K={K}")
    if cfg.block_m == 1 and M != 1:
        raise ValueError("block_m=1 (GEMV) needs M == 1")
    if cfg.swap and (cfg.block_m == 1 or group % cfg.block_k):
        raise ValueError(f"swap=True needs block_m > 1 and block_k={cfg.block_k} dividing the group size {group}")
    split, tiles, workspace, counters = _split_k_buffers(x, out, cfg, workspace, unused=mask)
    ng = K // group
    block_g = triton.next_power_of_2(ng) if cfg.variant == "local" else 1
    if cfg.variant == "local":  # each program's list slot (written and read by that program only)
        glist = torch.empty(tiles * split * block_g, device=x.device, dtype=torch.int32)
        nlist = glist
    elif cfg.variant != "list":  # never read
        glist = nlist = mask
    res = residual if residual is not None else out  # never read without HAS_RES
    rargs = _route_args(route, out, N, cfg.block_n, mask, split)
    _gemm_k_kernel[(tiles, split)](
        x, weight, bias if bias is not None else weight, out, workspace, counters, mask, glist, nlist, res,
        M, N, K, ng,
        x.stride(0), x.stride(1), weight.stride(0), weight.stride(1), out.stride(0), out.stride(1),
        mask.stride(0), mask.stride(1), res.stride(0), res.stride(1),
        GROUP=group, HAS_BIAS=bias is not None, HAS_RES=residual is not None, SPLIT=split, USE_LIST=listed,
        LOCAL_LIST=cfg.variant == "local", BLOCK_G=block_g,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, SWAP=cfg.swap,
        **rargs, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out


def _route_args(route: tuple | None, out: torch.Tensor, N: int, block_n: int, unused: torch.Tensor,
                split: int = 1) -> dict:
    """The ``ROUTE`` epilogue's arguments of `_gemm_k_kernel` (pointers stand in where it is off: never read);
    ``split``: the launch's K splits (programs per output tile)."""
    names = ("rdown_ptr", "rup_ptr", "rbias_ptr", "gamma_ptr", "ynorm_ptr", "dec_ptr", "rpart_ptr", "rcnt_ptr", "R",
             "RG", "sdr", "sug", "reps", "neps")
    if route is None:  # (every constexpr given: the sm_90 compile test binds the launch's arguments as passed)
        return dict(zip(names, (out, out, out, out, out, out, out, unused, 0, 0, 0, 0, 0.0, 0.0)), ROUTE=False,
                    R_NORMALIZE=True, R_HAS_UP=False, R_HAS_BIAS=False, BLOCK_R=16, BLOCK_RG=16, BLOCK_T=16,
                    BLOCK_D=16, R_WARM=False, R_GEPL=64, R_UEPL=32, BLOCK_W=16)
    down, up, bias, normalize, eps, gamma, norm_eps, y, dec = route
    if out.shape[0] != 1:
        raise ValueError(f"gemm_k route epilogue: one row, got {out.shape[0]}")
    R = down.shape[0]
    G = dec.shape[0]
    block_r = max(16, triton.next_power_of_2(R))
    tiles = triton.cdiv(N, block_n)
    parts = torch.empty(tiles * (block_r + 1), device=out.device, dtype=torch.float32)
    args = dict(zip(names, (down, up if up is not None else down, bias if bias is not None else down, gamma, y,
                            dec.view(torch.uint8), parts, arrival_counters(out.device, 1, owner="gemm_k_route"), R,
                            G, down.stride(0), up.stride(0) if up is not None else 0, float(eps), float(norm_eps))))
    # KernelOptions.route_warm: the tail's operands warmed into L2 by the programs' first loads
    # (`_warm_route_operands`), and the norm in one trip up to 4096 columns (the 8B shape: 4 trips before). ptxas for
    # sm_90, the launch specialised as Triton's launcher does, 8 warps: 46-56 registers a thread with 1024-, 2048- or
    # 4096-wide chunks alike (Triton 3.6 and 3.9), so the launch keeps its occupancy
    # (a hint only: the lines a program warms never change what the epilogue computes)
    warm = kernel_options().route_warm
    weights = up if up is not None else down
    block_w = 16
    if warm:  # lanes for this program's share of the tail's lines, and for its tile's rows of `down`
        shared_lines = (triton.cdiv(N * gamma.element_size(), 128)
                        + (triton.cdiv(((G - 1) * up.stride(0) + R) * up.element_size(), 128) if up is not None else 0)
                        + (triton.cdiv(G * weights.element_size(), 128) if bias is not None else 0))
        block_w = max(16, triton.next_power_of_2(max(triton.cdiv(R, split), triton.cdiv(shared_lines, tiles * split))))
    args.update(ROUTE=True, R_NORMALIZE=bool(normalize), R_HAS_UP=up is not None, R_HAS_BIAS=bias is not None,
                BLOCK_R=block_r, BLOCK_RG=max(16, min(triton.next_power_of_2(G), 4096 // block_r)),
                BLOCK_T=max(2, min(triton.next_power_of_2(tiles), 4096 // block_r)),
                BLOCK_D=max(16, min(triton.next_power_of_2(N), 4096 if warm else 1024)),
                R_WARM=warm, R_GEPL=max(1, 128 // gamma.element_size()), R_UEPL=max(1, 128 // weights.element_size()),
                BLOCK_W=block_w)
    return args


def gemm_k_dense(x, weight, bias, out, mask, group: int, x_masked: bool = False) -> torch.Tensor:
    """Large-M path (``"premask"``): ``x`` with its masked groups zeroed by one pass (skipped when ``x_masked``),
    then cuBLAS. Same layouts as :func:`gemm_k_direct`."""
    M, K = x.shape
    xm = x
    if not x_masked:
        xm = torch.empty(M, K, device=x.device, dtype=x.dtype)
        bm, bk = 32, 256
        _mask_columns_kernel[(triton.cdiv(M, bm), triton.cdiv(K, bk))](
            x, mask, xm, M, K, x.stride(0), x.stride(1), mask.stride(0), mask.stride(1),
            GROUP=group, BLOCK_M=bm, BLOCK_K=bk, num_warps=4)
    if bias is not None:
        torch.addmm(bias, xm, weight.t(), out=out)
    else:
        torch.mm(xm, weight.t(), out=out)
    return out


def gemm_k_sorted(x, weight, bias, out, mask, rows, tile_list, tile_count, group: int, config: GemmConfig,
                  workspace: torch.Tensor | None = None, x_masked: bool = False) -> torch.Tensor:
    """Large-M routed reduction-width GEMM over the plan's pattern-sorted token order
    (``RoutingPlan.tile_order(config.block_m)``): a token tile reads and multiplies only the groups one of
    its tokens runs, so structured masks (tokens that agree on groups) skip work that a tile in sequence
    order would still do.

    Args:
        x, weight, bias, out, mask: as in :func:`gemm_k_direct`.
        rows: ``[M]`` int32, the tokens in sorted order; tile_list: ``[n_tiles, G_count]`` int32, each tile's
            needed groups first; tile_count: ``[n_tiles]`` int32, how many (``n_tiles = ceil(M / block_m)``).
    """
    M, K = x.shape
    N = weight.shape[0]
    cfg = config
    ng = tile_list.shape[-1]
    if group % cfg.block_k:
        raise ValueError(f"block_k={cfg.block_k} must divide the group size {group} (sorted variant)")
    if tile_list.shape[0] != triton.cdiv(M, cfg.block_m) or tile_count.shape[0] != tile_list.shape[0]:
        raise ValueError(f"the tile lists were built for another block_m than {cfg.block_m}")
    split, tiles, workspace, counters = _split_k_buffers(x, out, cfg, workspace, unused=tile_count)
    _gemm_k_sorted_kernel[(tiles, split)](
        x, weight, bias if bias is not None else weight, out, workspace, counters, mask, rows, tile_list,
        tile_count, M, N, K, ng,
        x.stride(0), x.stride(1), weight.stride(0), weight.stride(1), out.stride(0), out.stride(1),
        mask.stride(0), mask.stride(1),
        GROUP=group, HAS_BIAS=bias is not None, SPLIT=split, X_MASKED=x_masked,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out
