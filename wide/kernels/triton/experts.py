"""The routed FFN as experts on the triton backend: the host function that picks the path
(`wide.kernels.experts.ffn_path`) and the expert path's small kernels around ``torch._grouped_mm``: the row
gather, the grouped SwiGLU and the fixed-order combine.

Paths: ``experts`` (wide groups, prefill: `gather_rows` -> grouped gate/up -> `swiglu_rows` -> grouped down ->
`combine`), ``tiles`` (the per-tile swiglu + gemm_k host functions, as the routed MLP ran before), ``dense``
(every pair runs: plain cuBLAS).
"""

from __future__ import annotations

import logging

import torch
import triton
import triton.language as tl

from .. import dispatch
from ..experts import ExpertLayout, expert_gemms, expert_layout, ffn_dense, ffn_path, grouped_mm_runs
from ..options import KernelOptions, kernel_options
from ..plan import RoutingPlan, plan_for
from .common import capturing, interpreting


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
def _gather_rows_kernel(x_ptr, rows_ptr, ends_ptr, out_ptr, K, G, sxm, som,
                        BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    live = r < tl.load(ends_ptr + G - 1)  # rows past the pairs are never read: no copy
    t = tl.load(rows_ptr + r, mask=live, other=0)
    m = live[:, None] & (k < K)[None, :]
    v = tl.load(x_ptr + t.to(tl.int64)[:, None] * sxm + k[None, :], mask=m)
    tl.store(out_ptr + r.to(tl.int64)[:, None] * som + k[None, :], v, mask=m)


@triton.jit
def _swiglu_rows_kernel(g_ptr, u_ptr, ends_ptr, W, G, sg, su, BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr):
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    m = (r < tl.load(ends_ptr + G - 1))[:, None] & (c < W)[None, :]
    gp = g_ptr + r.to(tl.int64)[:, None] * sg + c[None, :]
    a = tl.load(gp, mask=m, other=0.0).to(tl.float32)
    b = tl.load(u_ptr + r.to(tl.int64)[:, None] * su + c[None, :], mask=m, other=0.0).to(tl.float32)
    tl.store(gp, (a / (1.0 + tl.exp(-a)) * b).to(g_ptr.dtype.element_ty), mask=m)


def _tiles(interp_r: int, interp_c: int, r: int, c: int) -> tuple[int, int]:
    return (interp_r, interp_c) if interpreting() else (r, c)


def gather_rows(x2: torch.Tensor, layout: ExpertLayout) -> torch.Tensor:
    """``[R, K]`` grouped rows of ``x2 [M, K]`` (``x2[layout.rows]``), copying only the pairs' rows (their count
    read on the device: the buffer holds ``M * G`` rows under a layout built without host reads)."""
    R, K = layout.rows.shape[0], x2.shape[1]
    out = x2.new_empty(R, K)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    br, bk = _tiles(16, 32, 32, 512)
    _gather_rows_kernel[(triton.cdiv(R, br), triton.cdiv(K, bk))](
        x2, layout.rows, layout.ends, out, K, layout.ends.shape[0], x2.stride(0), out.stride(0),
        BLOCK_R=br, BLOCK_K=bk, num_warps=4)
    return out


def swiglu_rows(g: torch.Tensor, u: torch.Tensor, layout: ExpertLayout) -> torch.Tensor:
    """``g <- silu(g) * u`` (fp32 math, one rounding) over the pairs' rows of the ``[R, W]`` grouped layout."""
    R, W = g.shape
    br, bw = _tiles(16, 32, 32, 256)
    _swiglu_rows_kernel[(triton.cdiv(R, br), triton.cdiv(W, bw))](
        g, u, layout.ends, W, layout.ends.shape[0], g.stride(0), u.stride(0), BLOCK_R=br, BLOCK_W=bw, num_warps=4)
    return g


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
    x2 = x.reshape(-1, K)
    M = x2.shape[0]
    out = out if out is not None else x.new_empty(*x.shape[:-1], N)
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
    layout = expert_layout(plan, read_counts=gmm == "loop")
    if layout.capacity == 0:  # no pair runs (the loop's counts say so)
        return out.zero_()
    partial = expert_gemms(x2, gate, up, down, layout, gmm, partial_dtype, gather=gather_rows, swiglu=swiglu_rows)
    combine(partial, layout.slot, out2)
    return out

