"""Output-width routed GEMM (`gemm_mn`, fused SwiGLU) on Triton: the host function that picks the path, its
configs and heuristics, and the launchers of the kernels in `wide.kernels.triton.gemm_mn_kernels`.

Three layers (STYLE.md): ``@triton.jit`` kernels -> these host functions (path, shapes, grid, strides,
configs) -> the ``triton`` backend (`wide.kernels.backends.triton_backend`), which only verifies and delegates.

Paths (`gemm_mn` picks one per call from M, N, K, the group size and the plan's density):
- ``dense`` (large M, high mask density, where skipping cannot pay): cuBLAS + ``_mask_epilogue_kernel``;
- ``direct`` (small M: GEMV / skinny tiles, transposed ``swap`` tiles for decode batches);
- ``perm`` (large M): the plan's permuted active tokens, one program per tile or the persistent grid
  (``GemmConfig.persistent``, the default from M = 1024 with groups of >= 128).
"""

from __future__ import annotations

import torch
import triton

from ..options import KernelOptions, kernel_options
from ..plan import RoutingPlan, plan_for
from .common import (GemmConfig, arrival_counters, capturing, for_element_size, interpreting, pow2_divisor,
                     programs, rows_and_out)
from .gemm_mn_kernels import (_gemm_mn_direct_kernel, _gemm_mn_perm_kernel, _gemm_mn_tiles_kernel,
                              _mask_epilogue_kernel)

ACTIVATIONS = {None: 0, "silu": 1, "gelu": 2, "relu": 3}


# M at or below which gemm_mn uses the direct (GEMV / skinny) kernel instead of the permuted one
DIRECT_MAX_M = 64
# large-M gemm_mn / SwiGLU: above this fraction of executed (token, group) pairs, cuBLAS plus a masking
# epilogue beats the permuted Triton kernels (the per-tile one ran at ~2/3 of cuBLAS's rate on the H200, the
# persistent one at 0.8-0.9: 2026-12-01 sweep; the threshold was set for the former and still holds for q)
DENSE_DENSITY = 0.75
DENSE_MIN_M = 1024
# SwiGLU with K up to this many input channels takes the narrow-K prefill tiles (`default_mn_config`)
NARROW_K = 576


def dense_density(group: int) -> float:
    """Density above which the dense path wins; narrower groups mean narrower, slower routed tiles
    (H200 run 3, M=4096, 50%: group 128 1.39x, 64 1.03x, 32 0.69x routed vs ~0.92x dense path)."""
    if group >= 128:
        return DENSE_DENSITY
    return {64: 0.55, 32: 0.35}.get(group, 0.2 if group < 32 else DENSE_DENSITY)


def default_mn_config(M: int, N: int, K: int, group: int, swiglu: bool,
                      options: KernelOptions | None = None) -> tuple[str, GemmConfig]:
    """(kernel, config) for gemm_mn / SwiGLU: ``"direct"`` for small M, else ``"perm"`` (H200-tuned); ``options``
    (default: the current `kernel_options`) may switch the persistent or transposed tiles off."""
    options = options or kernel_options()
    if interpreting():
        if M <= 16:
            return "direct", GemmConfig(1 if M == 1 else 16, 16, 16)
        return "perm", GemmConfig(16, pow2_divisor(group, 16), 16, persistent=int(options.persistent_mn))
    if M == 1:
        # 2026-11-30 H200 sweep, 8B shapes, weights rotated over 8 copies (no L2 reuse): 4 x 512 tiles beat
        # 8 x 512 (q: 7.7 vs 8.2 us) and 16 x 256 (gate/up: 30.5 vs 32.1 us) at 50%, and at 100% too
        return "direct", GemmConfig(1, pow2_divisor(N, 4), 512, num_warps=4, num_stages=4)
    if M <= 16:
        # the transposed tile (swap: 64 weight rows as the MMA's M side, wgmma): 2026-12-01 sweep at M=16 (no L2
        # reuse, benchmarks/gemv_sweep.py --m 16 --swap-only), coherent 50%: gate/up 30.9-31.5 us vs 32.5-32.8 for
        # the 16 x 128 row tile, q 9.1 vs 10.4-10.6 (split 4 fills the SMs with half the 64-wide tiles skipped);
        # per-token and all-on within noise of the row tiles (gate/up 58.7 / 58.8, q 12.5 / 12.5)
        if not options.skinny_swap:  # the row tiles (2026-11-30 sweep)
            if swiglu:
                return "direct", GemmConfig(16, pow2_divisor(N, 128), 128, num_warps=4, num_stages=4)
            return "direct", GemmConfig(16, pow2_divisor(N, 32), 256, num_warps=4, num_stages=4,
                                        split_k=2 if K >= 2048 else 1)
        if swiglu:
            return "direct", GemmConfig(16, pow2_divisor(N, 64), 128, num_warps=4, num_stages=4, swap=True)
        return "direct", GemmConfig(16, pow2_divisor(N, 64), 128, num_warps=4, num_stages=4,
                                    split_k=4 if K >= 2048 else 1, swap=True)
    if M <= DIRECT_MAX_M:
        bm = 32 if M <= 32 else 64
        return "direct", GemmConfig(bm, pow2_divisor(N, 64), 128, num_warps=4, num_stages=4)
    if M <= 256:
        if swiglu and M <= 128:  # H200 run 2: 70 us at M=128 (dense 75 us)
            return "direct", GemmConfig(128, pow2_divisor(N, 128), 64, num_warps=8, num_stages=4)
        return "perm", GemmConfig(64, pow2_divisor(group, 128), 64, num_warps=4, num_stages=4)
    if swiglu and K <= NARROW_K and M >= DENSE_MIN_M and group % 64 == 0 and options.narrow_swiglu:
        # a narrow hidden size (SmolLM2's K = 576): the 128 x 128 persistent tiles below lose to 128 x 64 tiles
        # of 4 warps, one program per tile. 2026-12-06 H100 sweep (`prefill_gemm_sweep.py --shape smollm2-135m`,
        # M = 4096, 50% random masks): 30.0 us vs 34.5 us (cuBLAS with every group 29.5 us). At Qwen2.5-1.5B's
        # K = 1536 the default below stays best (238 vs 234 us for its persistent twin, noise), so the rule stops
        # at NARROW_K; K between 576 and 1536 (e.g. Qwen2.5-0.5B's 896) is not measured
        return "perm", GemmConfig(128, 64, 64, num_warps=4, num_stages=3)
    if M >= DENSE_MIN_M and group % 128 == 0 and options.persistent_mn:
        # the persistent kernel over the active tiles: 2026-12-01 H200 sweep (benchmarks/prefill_gemm_sweep.py),
        # 50% random masks, us at M = 1024 / 4096 / 16384 against the one-program-per-tile kernel: gate/up 242 / 860
        # / 3715 vs 276 / 984 / 3855 (cuBLAS with every group: 357 / 1478 / 5832); q (groups of 512: 256-wide
        # tiles) 53 / 147 / 480 vs 105 / 177 / 537 (cuBLAS 49 / 177 / 837). All groups on, gate/up runs at
        # 0.90-0.92 of cuBLAS's rate at 1024 / 4096 (0.81 at 16384). A single weight with 128-wide groups (the
        # kernel table's [14336, 4096] row) takes 256-row tiles: 2026-12-02 sweep (`--ops up_proj --wide`), 50%,
        # 448 / 1861 us at M = 4096 / 16384 against 552 / 2571 with 128-row ones (the 2026-12-01 default, which
        # had cost that row 1.40x -> 1.24x) and 498 / 2030 one program per tile
        bn = 128 if swiglu else pow2_divisor(group, 256)
        bm = 256 if not swiglu and bn == 128 else 128
        return "perm", GemmConfig(bm, bn, 64, num_warps=8, num_stages=3, persistent=1)
    bm = 256 if M >= 4096 and not swiglu else 128  # run 2: 496 us vs 516 us at M=4096
    return "perm", GemmConfig(bm, pow2_divisor(group, 128), 64, num_warps=8, num_stages=3)


def gemm_mn(x, weight, weight2, mask, bias, activation, swiglu: bool, plan: RoutingPlan | None, out,
            config: tuple | None = None, options: KernelOptions | None = None) -> torch.Tensor:
    """Routed output-width GEMM / SwiGLU: picks the path and its config, then launches it.

    Args:
        x: ``[..., K]``.
        weight: ``[N, K]`` (gate rows when ``swiglu``); weight2: ``[N, K]`` up rows (``swiglu``) or ``None``.
        mask: ``[..., N/G]`` bool.
        bias: ``[N]`` or ``None``; activation: ``None``, ``"silu"``, ``"gelu"`` or ``"relu"``.
        plan: the mask's routing plan or ``None`` (made here when a path needs it).
        out: ``[..., N]`` or ``None``.
        config: ``(kernel, GemmConfig)`` with kernel ``"direct"`` / ``"perm"``, or ``("dense", None)``; ``None``:
            the dense path where the density says so, else `default_mn_config`.
        options: the A/B switches of the default configs (``None``: the current `kernel_options`).
    """
    K = x.shape[-1]
    N = weight.shape[0]
    ng = mask.shape[-1]
    group = N // ng
    x2, out = rows_and_out(x, N, out)
    M = x2.shape[0]
    out2 = out.view(-1, N)
    if M == 0:
        return out
    act_id = ACTIVATIONS[activation]
    hinted = plan is not None and plan.density_hint is not None
    if config is None and M >= DENSE_MIN_M and (hinted or not capturing(x)):
        # a hinted plan chooses with no host read, so under stream capture too (a routed model at 0% then
        # captures cuBLAS, as its eager run does); an unhinted one measures its mask, which capture forbids
        plan = plan_for(mask, plan)
        if plan.expected_density() >= dense_density(group):
            config = ("dense", None)
    if config is None:
        kernel, cfg = default_mn_config(M, N, K, group, swiglu, options)
        cfg = for_element_size(cfg, x.element_size())
    else:
        kernel, cfg = config
    if kernel == "dense":
        mask2 = mask.reshape(-1, ng).view(torch.uint8)
        all_active = not capturing(x) and plan_for(mask, plan).known_all_active()
        gemm_mn_dense(x2, weight, weight2, bias, out2, mask2, group, act_id, swiglu, all_active)
    elif kernel == "direct":
        mask2 = mask.reshape(-1, ng).view(torch.uint8)
        gemm_mn_direct(x2, weight, weight2, bias, out2, mask2, group, act_id, swiglu, cfg)
    else:
        perm, counts = plan_for(mask, plan).token_order(flat=True)
        gemm_mn_perm(x2, weight, weight2, bias, out2, perm[0], counts[0], group, act_id, swiglu, cfg)
    return out


def gemm_mn_perm(x, weight, weight2, bias, out, perm, counts, group: int, act: int, swiglu: bool,
                 config: GemmConfig) -> torch.Tensor:
    """Large-M routed output-width GEMM over the plan's permuted active tokens.

    Args:
        x: ``[M, K]``.
        weight: ``[N, K]`` (gate rows when ``swiglu``); weight2: ``[N, K]`` up rows or ``None``.
        bias: ``[N]`` or ``None``.
        out: ``[M, N]``, fully written.
        perm: ``[G_count, M]`` int32 token permutation (active first); counts: ``[G_count]`` int32.
    """
    M, K = x.shape
    N = weight.shape[0]
    cfg = config
    if group % cfg.block_n:
        raise ValueError(f"block_n={cfg.block_n} must divide the group size {group}")
    w2 = weight2 if weight2 is not None else weight
    if cfg.persistent:
        return _gemm_mn_tiles(x, weight, w2, bias, out, perm, counts, group, act, swiglu, cfg)
    grid = (triton.cdiv(M, cfg.block_m) * (N // cfg.block_n),)
    _gemm_mn_perm_kernel[grid](
        x, weight, w2, bias if bias is not None else weight, out, perm, counts,
        M, N, K,
        x.stride(0), x.stride(1), weight.stride(0), weight.stride(1), w2.stride(0), w2.stride(1),
        out.stride(0), out.stride(1),
        GROUP=group, HAS_BIAS=bias is not None, ACT=act, SWIGLU=swiglu, EVEN_K=K % cfg.block_k == 0,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out


def _gemm_mn_tiles(x, weight, w2, bias, out, perm, counts, group, act, swiglu, cfg):
    M, K = x.shape
    N = weight.shape[0]
    G = N // group
    tiles = triton.cdiv(M, cfg.block_m) * (N // cfg.block_n)
    progs = min(tiles, programs(x.device, cfg.persistent))
    _gemm_mn_tiles_kernel[(progs,)](
        x, weight, w2, bias if bias is not None else weight, out, perm, counts,
        M, N, K, progs,
        x.stride(0), x.stride(1), weight.stride(0), weight.stride(1), w2.stride(0), w2.stride(1),
        out.stride(0), out.stride(1),
        GROUP=group, G=G, BLOCK_G=triton.next_power_of_2(G),
        HAS_BIAS=bias is not None, ACT=act, SWIGLU=swiglu, EVEN_K=K % cfg.block_k == 0,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out


def gemm_mn_direct(x, weight, weight2, bias, out, mask, group: int, act: int, swiglu: bool,
                   config: GemmConfig) -> torch.Tensor:
    """Small-M routed output-width GEMM; ``mask`` is ``[M, G_count]`` (uint8 view of the bool mask)."""
    M, K = x.shape
    N = weight.shape[0]
    cfg = config
    if N % cfg.block_n:
        raise ValueError(f"block_n={cfg.block_n} must divide N={N}")
    if cfg.block_m == 1 and M != 1:
        raise ValueError("block_m=1 (GEMV) needs M == 1")
    if cfg.swap and cfg.block_m == 1:
        raise ValueError("swap=True needs block_m > 1 (the GEMV has no MMA to transpose)")
    w2 = weight2 if weight2 is not None else weight
    split = max(1, cfg.split_k)
    grid = (triton.cdiv(M, cfg.block_m), N // cfg.block_n, split)
    ws, counters = out, mask  # never read without split-K
    if split > 1:
        ws = torch.empty(split * M * N * (2 if swiglu else 1), device=x.device, dtype=torch.float32)
        counters = arrival_counters(x.device, grid[0] * grid[1])
    _gemm_mn_direct_kernel[grid](
        x, weight, w2, bias if bias is not None else weight, out, mask, ws, counters,
        M, N, K,
        x.stride(0), x.stride(1), weight.stride(0), weight.stride(1), w2.stride(0), w2.stride(1),
        out.stride(0), out.stride(1), mask.stride(0), mask.stride(1),
        GROUP=group, HAS_BIAS=bias is not None, ACT=act, SWIGLU=swiglu, EVEN_K=K % cfg.block_k == 0,
        SPLIT=split, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SWAP=cfg.swap,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out


def gemm_mn_dense(x, weight, weight2, bias, out, mask, group: int, act: int, swiglu: bool,
                  all_active: bool) -> torch.Tensor:
    """High-density path: cuBLAS for the full product, then one masking (and activation) pass.

    ``all_active`` with no activation skips the pass: the routed op is then exactly the dense one.
    """
    M = x.shape[0]
    N = weight.shape[0]
    if swiglu:
        y = torch.mm(x, weight.t())
        u = torch.mm(x, weight2.t())
    else:
        y = out
        if bias is not None:
            torch.addmm(bias, x, weight.t(), out=y)
        else:
            torch.mm(x, weight.t(), out=y)
        u = y
        if all_active and act == 0:
            return out
    bm, bn = 32, 256
    _mask_epilogue_kernel[(triton.cdiv(M, bm), triton.cdiv(N, bn))](
        y, u, out, mask, M, N, mask.stride(0), mask.stride(1),
        GROUP=group, ACT=act, SWIGLU=swiglu, BLOCK_M=bm, BLOCK_N=bn, num_warps=4)
    return out
