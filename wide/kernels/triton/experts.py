"""The routed FFN as experts on the triton backend: the host function that picks the path
(`wide.kernels.experts.ffn_path`) and the expert path's small kernels around ``torch._grouped_mm``: the row
gather, the grouped SwiGLU and the fixed-order combine.

Paths: ``experts`` (wide groups, prefill: `build_layout` -> `gather_rows` -> grouped gate/up -> `swiglu_rows` ->
grouped down -> `combine`: four Triton launches and three grouped GEMMs, no host read), ``tiles`` (the per-tile
swiglu + gemm_k host functions, as the routed MLP ran before), ``dense`` (every pair runs: plain cuBLAS).
"""

from __future__ import annotations

import logging

import torch
import triton
import triton.language as tl

from .. import dispatch
from ..experts import (ExpertLayout, expert_gemms, expert_layout, ffn_dense, ffn_path, gemm_k_path, grouped_mm_runs,
                       reduce_gemm)
from ..options import KernelOptions, kernel_options
from ..plan import RoutingPlan, plan_for
from .common import capturing, interpreting, programs, rows_and_out


@triton.jit
def _combine_kernel(part_ptr, slot_ptr, out_ptr, M, N, G, spr, ssm, ssg, som,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rin = rows < M
    cin = cols < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for g in range(0, G):  # group order, fp32: the same sum, in the same order, on every run
        s = tl.load(slot_ptr + rows.to(tl.int64) * ssm + g * ssg, mask=rin, other=-1)
        p = tl.load(part_ptr + s.to(tl.int64)[:, None] * spr + cols[None, :],
                    mask=(s >= 0)[:, None] & cin[None, :], other=0.0)
        acc += p.to(tl.float32)
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * som + cols[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=rin[:, None] & cin[None, :])


def combine(partial: torch.Tensor, slot: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out[t] = sum over the groups g that t runs, in group order, of partial[slot[t, g]]`` (fp32 sum).

    One program per (token tile, N tile) loops over the groups and reads each token's partial row through its
    slot, so no atomics and no zero-filled buffer: deterministic. Memory traffic: the partial rows once
    (``pairs * N`` elements of ``partial``'s dtype: at 50% of an 8B FFN's 14 groups, 7 ``[M, N]`` bf16 reads),
    the slots (``M * G`` int32) and ``out`` once (``M * N``).

    Args:
        partial: ``[R, N]`` bf16 / fp16 / fp32 grouped partial rows (row stride free, unit column stride).
        slot: ``[M, G]`` int32, the row of (token, group), ``-1`` where the token skips the group.
        out: ``[M, N]`` contiguous.
    """
    M, G = slot.shape
    N = out.shape[1]
    if partial.stride(-1) != 1:
        raise ValueError("combine: partial needs unit column stride")
    if interpreting():
        bm, bn, warps = 16, 32, 4
    else:  # rows of 256 contiguous elements per (token, group): full 128-byte lines
        bm, bn, warps = 32, 256, 8
    _combine_kernel[(triton.cdiv(M, bm), triton.cdiv(N, bn))](
        partial, slot, out, M, N, G, partial.stride(0), slot.stride(0), slot.stride(1), out.stride(0),
        BLOCK_M=bm, BLOCK_N=bn, num_warps=warps)
    return out


@triton.jit
def _layout_kernel(mask_ptr, rows_ptr, slot_ptr, ends_ptr, M, G, smm, smg,
                   BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr, SCAN_M: tl.constexpr):
    m0 = tl.program_id(0) * BLOCK_M
    g = tl.arange(0, BLOCK_G)
    gin = g < G
    # every program counts each group's tokens in the whole mask (the group starts) and before its block (its
    # offset within the group): the mask is M * G bytes, L2-resident, so the repeated reads cost less than a
    # second launch and a cross-program scan
    total = tl.zeros((BLOCK_G,), dtype=tl.int32)
    before = tl.zeros((BLOCK_G,), dtype=tl.int32)
    for s0 in range(0, M, SCAN_M):
        t = s0 + tl.arange(0, SCAN_M)
        a = tl.load(mask_ptr + t.to(tl.int64)[:, None] * smm + g[None, :] * smg,
                    mask=(t < M)[:, None] & gin[None, :], other=0)
        a = (a != 0).to(tl.int32)
        total += tl.sum(a, axis=0)
        before += tl.sum(tl.where((t < m0)[:, None], a, 0), axis=0)
    ends = tl.cumsum(total, axis=0)
    first = ends - total + before  # this block's first grouped row of each group
    t = m0 + tl.arange(0, BLOCK_M)
    inb = (t < M)[:, None] & gin[None, :]
    a = (tl.load(mask_ptr + t.to(tl.int64)[:, None] * smm + g[None, :] * smg, mask=inb, other=0) != 0).to(tl.int32)
    row = first[None, :] + tl.cumsum(a, axis=0) - a  # tokens ascending within each group
    live = a != 0
    tl.store(slot_ptr + t.to(tl.int64)[:, None] * G + g[None, :], tl.where(live, row, -1), mask=inb)
    tl.store(rows_ptr + row, tl.broadcast_to(t[:, None], (BLOCK_M, BLOCK_G)), mask=live)
    if tl.program_id(0) == 0:
        tl.store(ends_ptr + g, ends, mask=gin)


def build_layout(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``mask [M, G]`` bool -> ``(ends [G], rows [M * G], slot [M, G])`` int32 in one launch, no host read
    (CUDA-graph safe): `wide.kernels.experts.layout_reference`'s layout (rows past ``ends[-1]`` left unwritten).

    One program per block of tokens; each reads the whole mask once more for the counts (``M * G`` bytes: 57 KB
    at 4096 tokens and 14 groups) and writes its tokens' slots and grouped rows. It replaces the plan's
    partition plus ~12 torch launches, among them a cumsum along the token axis that ran one thread per group
    (the ~0.9 ms at 4096 tokens, ~3.3 ms at 16384 of the first H200 measurement)."""
    M, G = mask.shape
    m = mask.view(torch.uint8)
    ends = torch.empty(G, device=mask.device, dtype=torch.int32)
    rows = torch.empty(M * G, device=mask.device, dtype=torch.int32)
    slot = torch.empty(M, G, device=mask.device, dtype=torch.int32)
    if M == 0 or G == 0:
        ends.zero_()
        return ends, rows, slot
    bg = triton.next_power_of_2(G)
    if interpreting():
        bm, scan = 16, 32
    else:  # [256 x 16] own tiles, [1024 x 16] scan tiles
        bm, scan = max(16, 4096 // bg), max(16, 16384 // bg)
    scan = min(scan, max(16, triton.next_power_of_2(M)))
    _layout_kernel[(triton.cdiv(M, bm),)](m, rows, slot, ends, M, G, m.stride(0), m.stride(1),
                                          BLOCK_M=bm, BLOCK_G=bg, SCAN_M=scan, num_warps=8 if bg * scan > 8192 else 4)
    return ends, rows, slot


@triton.jit
def _gather_rows_kernel(x_ptr, rows_ptr, ends_ptr, out_ptr, K, G, sxm, som,
                        BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    total = tl.load(ends_ptr + G - 1)  # the pairs: the programs stride over their tiles only
    n_k = tl.cdiv(K, BLOCK_K)
    for w in range(tl.program_id(0), tl.cdiv(total, BLOCK_R) * n_k, tl.num_programs(0)):
        r = (w // n_k) * BLOCK_R + tl.arange(0, BLOCK_R)
        k = (w % n_k) * BLOCK_K + tl.arange(0, BLOCK_K)
        live = r < total
        t = tl.load(rows_ptr + r, mask=live, other=0)
        m = live[:, None] & (k < K)[None, :]
        v = tl.load(x_ptr + t.to(tl.int64)[:, None] * sxm + k[None, :], mask=m)
        tl.store(out_ptr + r.to(tl.int64)[:, None] * som + k[None, :], v, mask=m)


@triton.jit
def _gather_cols_kernel(x_ptr, rows_ptr, ends_ptr, out_ptr, W, G, sxm, som,
                        BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_G: tl.constexpr):
    total = tl.load(ends_ptr + G - 1)
    gi = tl.arange(0, BLOCK_G)
    e = tl.load(ends_ptr + gi, mask=gi < G, other=2147483647)  # the group ends, once per program
    n_w = tl.cdiv(W, BLOCK_W)
    for w in range(tl.program_id(0), tl.cdiv(total, BLOCK_R) * n_w, tl.num_programs(0)):
        r = (w // n_w) * BLOCK_R + tl.arange(0, BLOCK_R)
        c = (w % n_w) * BLOCK_W + tl.arange(0, BLOCK_W)
        live = r < total
        t = tl.load(rows_ptr + r, mask=live, other=0)
        g = tl.sum((e[None, :] <= r[:, None]).to(tl.int32), axis=1)  # the group holding row r
        m = live[:, None] & (c < W)[None, :]
        v = tl.load(x_ptr + t.to(tl.int64)[:, None] * sxm + (g * W)[:, None] + c[None, :], mask=m)
        tl.store(out_ptr + r.to(tl.int64)[:, None] * som + c[None, :], v, mask=m)


@triton.jit
def _swiglu_rows_kernel(g_ptr, u_ptr, ends_ptr, W, G, sg, su, BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr):
    total = tl.load(ends_ptr + G - 1)
    n_w = tl.cdiv(W, BLOCK_W)
    for w in range(tl.program_id(0), tl.cdiv(total, BLOCK_R) * n_w, tl.num_programs(0)):
        r = (w // n_w) * BLOCK_R + tl.arange(0, BLOCK_R)
        c = (w % n_w) * BLOCK_W + tl.arange(0, BLOCK_W)
        m = (r < total)[:, None] & (c < W)[None, :]
        gp = g_ptr + r.to(tl.int64)[:, None] * sg + c[None, :]
        a = tl.load(gp, mask=m, other=0.0).to(tl.float32)
        b = tl.load(u_ptr + r.to(tl.int64)[:, None] * su + c[None, :], mask=m, other=0.0).to(tl.float32)
        tl.store(gp, (a / (1.0 + tl.exp(-a)) * b).to(g_ptr.dtype.element_ty), mask=m)


def _tiles(interp_r: int, interp_c: int, r: int, c: int) -> tuple[int, int]:
    return (interp_r, interp_c) if interpreting() else (r, c)


def _grid(device: torch.device, R: int, br: int, C: int, bc: int) -> tuple[int]:
    # a persistent grid over the capacity's tiles: the programs past the pairs' tiles (half of them or more
    # with M * G rows of capacity) would only start and exit, so they are never launched
    return (max(1, min(triton.cdiv(R, br) * triton.cdiv(C, bc), programs(device, 8))),)


def gather_rows(x2: torch.Tensor, layout: ExpertLayout, out: torch.Tensor | None = None) -> torch.Tensor:
    """``[R, K]`` grouped rows of ``x2 [M, K]`` (``x2[layout.rows]``, into ``out`` when given), copying only the
    pairs' rows (their count read on the device: the buffer holds ``M * G`` rows under a layout built without
    host reads; the rows past the pairs are left as they were)."""
    R, K = layout.rows.shape[0], x2.shape[1]
    out = out if out is not None else x2.new_empty(R, K)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    br, bk = _tiles(16, 32, 32, 512)
    _gather_rows_kernel[_grid(x2.device, R, br, K, bk)](
        x2, layout.rows, layout.ends, out, K, layout.ends.shape[0], x2.stride(0), out.stride(0),
        BLOCK_R=br, BLOCK_K=bk, num_warps=4)
    return out


def gather_cols(x2: torch.Tensor, layout: ExpertLayout, width: int) -> torch.Tensor:
    """``[R, width]``: the pairs' rows of `gather_cols_reference` (row ``r`` of group ``g``: its token's columns
    ``g * width .. (g + 1) * width``), their count read on the device; rows past the pairs are left unwritten."""
    R = layout.rows.shape[0]
    out = x2.new_empty(R, width)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    G = layout.ends.shape[0]
    br, bw = _tiles(16, 32, 32, 256)
    _gather_cols_kernel[_grid(x2.device, R, br, width, bw)](
        x2, layout.rows, layout.ends, out, width, G, x2.stride(0), out.stride(0),
        BLOCK_R=br, BLOCK_W=bw, BLOCK_G=max(2, triton.next_power_of_2(G)), num_warps=4)
    return out


def swiglu_rows(g: torch.Tensor, u: torch.Tensor, layout: ExpertLayout) -> torch.Tensor:
    """``g <- silu(g) * u`` (fp32 math, one rounding) over the pairs' rows of the ``[R, W]`` grouped layout."""
    R, W = g.shape
    br, bw = _tiles(16, 32, 32, 256)
    _swiglu_rows_kernel[_grid(g.device, R, br, W, bw)](
        g, u, layout.ends, W, layout.ends.shape[0], g.stride(0), u.stride(0), BLOCK_R=br, BLOCK_W=bw, num_warps=4)
    return g


def layout_for(plan: RoutingPlan, read_counts: bool) -> ExpertLayout:
    """`wide.kernels.experts.expert_layout` built by `build_layout` (one launch), cached on the plan."""
    return expert_layout(plan, read_counts, build=build_layout)


def ffn_experts(x, gate, up, down, mask, plan: RoutingPlan | None, out, path: str | None = None,
                gmm: str | None = None, partial_dtype: torch.dtype | None = None,
                options: KernelOptions | None = None) -> torch.Tensor:
    """Routed SwiGLU FFN ``gemm_k(swiglu(x, gate, up, mask), down, mask)``: picks the path, then runs it.

    Args:
        x: ``[..., K]``; gate, up: ``[F, K]``; down: ``[N, F]``; mask: ``[..., G]`` bool.
        plan: the mask's routing plan or ``None``; out: ``[..., N]`` or ``None``.
        path: ``"experts"``, ``"tiles"`` or ``"dense"`` (``"dense"`` only for all-true masks); ``None``:
            `ffn_path`'s choice.
        gmm: the expert path's grouped GEMMs, ``"grouped"`` or ``"loop"``; ``None``: ``torch._grouped_mm``
            where it runs (CUDA bf16, sm_90+), else the loop (one host read of the counts).
        partial_dtype: the expert path's partial rows (default x's dtype; float32 takes the loop).
        options: the A/B switches (``None``: the current `kernel_options`; ``ffn_experts=False``: per-tile).
    """
    if path not in (None, "experts", "tiles", "dense"):
        raise ValueError(f"path: 'experts', 'tiles' or 'dense', got {path!r}")
    if gmm not in (None, "grouped", "loop"):
        raise ValueError(f"gmm: 'grouped' or 'loop', got {gmm!r}")
    K = x.shape[-1]
    F_, N, G = gate.shape[0], down.shape[0], mask.shape[-1]
    x2, out = rows_and_out(x, N, out)
    M = x2.shape[0]
    if M == 0:
        return out
    plan = plan_for(mask, plan)
    eager = not capturing(x)
    options = options or kernel_options()
    if path is None:
        path = ffn_path(M, F_ // G, plan, eager, options.ffn_experts)
        if path == "experts" and not eager and gmm != "grouped" and not grouped_mm_runs(x, K, F_ // G, N)[0]:
            path = "tiles"  # the loop reads the counts on the host
    dispatch._log_once(logging.INFO, "ffn_experts", "triton", f"{path} path, {G} groups of {F_ // G}")
    if path == "tiles":
        from . import gemm_k as k_host, gemm_mn as mn_host

        h = mn_host.gemm_mn(x, gate, up, mask, None, None, True, plan, None, None)
        return k_host.gemm_k(h, down, mask, None, plan, out, True, None)
    out2 = out.view(-1, N)
    if path == "dense":
        ffn_dense(x2, gate, up, down, out2)
        return out
    partial_dtype = partial_dtype or x.dtype
    if gmm is None:
        gmm = "grouped" if partial_dtype == x.dtype and grouped_mm_runs(x, K, F_ // G, N)[0] else "loop"
    # the grouped GEMMs read their offsets on the device: no host read (M * G rows of buffer, the pairs' used)
    layout = layout_for(plan, read_counts=gmm == "loop")
    if layout.capacity == 0:  # no pair runs (the loop's counts say so)
        return out.zero_()
    partial = expert_gemms(x2, gate, up, down, layout, gmm, partial_dtype, gather=gather_rows, swiglu=swiglu_rows)
    combine(partial, layout.slot, out2)
    return out



def use_gemm_k_experts(x, weight, mask, plan: RoutingPlan, options: KernelOptions | None = None) -> bool:
    """Whether the triton `gemm_k` of this call runs as experts (`gemm_k_path`; under CUDA-graph capture only where
    ``torch._grouped_mm`` runs, since the loop reads the counts on the host)."""
    options = options or kernel_options()
    if not options.gemm_k_experts:
        return False
    N, K = weight.shape
    G = mask.shape[-1]
    M = x.numel() // K
    eager = not capturing(x)
    if gemm_k_path(M, K // G, plan, eager, True) != "experts":
        return False
    return eager or grouped_mm_runs(x, K // G, N)[0]


def gemm_k_experts(x, weight, mask, bias, plan: RoutingPlan | None, out, residual=None, gmm: str | None = None,
                   partial_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Routed reduction-width GEMM ``(x * mask expanded) @ weight^T (+ bias) (+ residual)`` as experts:
    `build_layout` -> `gather_cols` -> one grouped GEMM over the weight's column groups -> `combine` (fixed group
    order, fp32), then the bias and the residual added to the rounded sum.

    Args:
        x: ``[..., K]``; weight: ``[N, K]``; mask: ``[..., G]`` bool; bias: ``[N]`` or ``None``.
        plan: the mask's plan or ``None``; out: ``[..., N]`` or ``None``; residual: ``[..., N]`` or ``None``.
        gmm, partial_dtype: as in `ffn_experts`.
    """
    if gmm not in (None, "grouped", "loop"):
        raise ValueError(f"gmm: 'grouped' or 'loop', got {gmm!r}")
    N, K = weight.shape
    G = mask.shape[-1]
    x2, out = rows_and_out(x, N, out)
    if x2.shape[0] == 0:
        return out
    plan = plan_for(mask, plan)
    out2 = out.view(-1, N)
    partial_dtype = partial_dtype or x.dtype
    if gmm is None:
        gmm = "grouped" if partial_dtype == x.dtype and grouped_mm_runs(x, K // G, N)[0] else "loop"
    dispatch._log_once(logging.INFO, "gemm_k_experts", "triton", f"experts path ({gmm}), {G} groups of {K // G}")
    layout = layout_for(plan, read_counts=gmm == "loop")
    if layout.capacity == 0:
        out2.zero_()
    else:
        combine(reduce_gemm(x2, weight, layout, gmm, partial_dtype, gather_cols=gather_cols), layout.slot, out2)
    if bias is not None:
        out2.add_(bias)
    if residual is not None:
        out2.add_(residual.reshape(-1, N))
    return out
