"""Routed GEMM kernels (Triton): output-width (`gemm_mn`, fused SwiGLU) and reduction-width (`gemm_k`).

Three layers (STYLE.md): ``@triton.jit`` kernels -> host functions below (shapes, grid, strides,
configs) -> the ``triton`` backend in `wide.kernels.backends.triton_backend`. Nothing else launches these.

Kernels
- ``_gemm_mn_perm_kernel`` (large M): grid over (token tile of a group's *permuted* active list, N tile
  inside one group). A tile reads its x rows indirectly through the plan's permutation, so it only
  loads active rows; tiles past the group's count skip the K loop and only write zeros (the output
  rows they cover are the group's inactive tokens). Every output element is written exactly once.
- ``_gemm_mn_tiles_kernel`` (large M, the default from M = 1024): the same tiles, but a persistent grid
  (one program per SM) walks the list of *active* tiles, group after group (its token tiles innermost, so
  programs running side by side share a weight tile), then the inactive tokens' zero tiles; the list is
  derived in-kernel from the plan's counts (no launch, nothing read on the host).
- ``_gemm_mn_direct_kernel`` (small M, GEMV/skinny GEMM): grid over N tiles x token tiles in natural
  order (x K splits); a tile whose groups no token executes skips reading the weights (the bytes win at M=1);
  otherwise it behaves like a dense skinny GEMM and zeroes masked outputs in the epilogue. With split-K the
  partials go to an fp32 workspace and the tile's last program to arrive sums them and runs the epilogue.
- ``_gemm_k_kernel``: grid over (N tile, token tile, K split). Its K loop is either affine over all
  chunks, with loads of groups no token in the tile runs masked off (no bytes move), or runs over the
  plan's compacted list of needed groups (the GEMV default: no loop trips on skipped groups). x rows of
  tokens that skip a group are never loaded. Split-K partials go to an fp32 workspace; the tile's last
  program to arrive (an atomic counter per tile) sums them in split order and writes the output, so the
  sum is deterministic and needs no second launch.
- ``_gemm_k_sorted_kernel`` (large M, structured masks): tokens in the plan's pattern-sorted order (one
  permutation per mask, gathered on load and scattered on store), each token tile walking its own compacted
  list of needed groups. Picked over the dense path when the sorted tiles need few enough of their groups.
- Skinny tiles (decode batches): ``GemmConfig.swap`` computes the transposed tile, 64 weight rows as the
  MMA's M side and the tokens as its N side, so that Hopper's wgmma takes it (16-row tiles fall back to
  mma.sync); the decode-sized defaults use it.
- Dense paths (the host picks them where skipping cannot pay; see the notes in benchmarks/): large-M
  gemm_k = ``_mask_columns_kernel`` + cuBLAS (with independent random masks every tile needs every
  group); large-M gemm_mn/SwiGLU at high mask density = cuBLAS + ``_mask_epilogue_kernel``.
"""

from __future__ import annotations

import dataclasses
import os

import torch
import triton
import triton.language as tl

ACTIVATIONS = {None: 0, "silu": 1, "gelu": 2, "relu": 3}


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def persistent_mn() -> bool:
    """Whether prefill-sized gemm_mn / SwiGLU (M >= 1024, groups of 128 or more) take the persistent kernel;
    ``WIDE_PERSISTENT_MN=0`` gives the one-program-per-tile kernel back (benchmark A/Bs)."""
    return os.environ.get("WIDE_PERSISTENT_MN", "1") != "0"


def skinny_swap() -> bool:
    """Whether the decode-sized defaults (M <= 16 gemm_mn / SwiGLU, M <= 32 gemm_k) take the transposed tile;
    ``WIDE_SKINNY_SWAP=0`` gives the row tiles back (benchmark A/Bs: benchmarks/gpu_session.sh ab)."""
    return os.environ.get("WIDE_SKINNY_SWAP", "1") != "0"


@dataclasses.dataclass(frozen=True)
class GemmConfig:
    """Launch configuration for one routed GEMM call (tests pass tiny ones; defaults are tuned)."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    group_m: int = 8
    split_k: int = 1
    # gemm_k: "" = affine K loop with masked loads, "list" = the plan's needed-group list, "local" = each token
    # tile's needed-group list built inside the kernel (no launch before it), "premask" = mask pass + cuBLAS,
    # "sorted" = pattern-sorted tokens with per-tile group lists (gemm_k_sorted)
    variant: str = ""
    # skinny tiles (direct gemm_mn, gemm_k; block_m > 1): compute the transposed tile, weights as the MMA's
    # M side (block_n rows) and the tokens as its N side, so that block_n >= 64 takes Hopper's wgmma
    swap: bool = False
    # large-M gemm_mn / SwiGLU: > 0 = the persistent kernel over the active-tile list with this many programs
    # per SM (``_gemm_mn_tiles_kernel``)
    persistent: int = 0


# --------------------------------------------------------------------------------------------------
# kernels
# --------------------------------------------------------------------------------------------------


@triton.jit
def _activation(x, ACT: tl.constexpr):
    if ACT == 1:
        x = x * tl.sigmoid(x)
    elif ACT == 2:
        x = 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))
    elif ACT == 3:
        x = tl.maximum(x, 0.0)
    return x


@triton.jit
def _mn_epilogue(acc, acc2, b_ptr, rn, keep, HAS_BIAS: tl.constexpr, ACT: tl.constexpr, SWIGLU: tl.constexpr):
    """Output-width epilogue: bias, then the activation (or SiLU(gate) * up), zeros where ``keep`` is False."""
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn).to(tl.float32)[None, :]
    if SWIGLU:
        acc = acc * tl.sigmoid(acc) * acc2
    else:
        acc = _activation(acc, ACT)
    return tl.where(keep, acc, 0.0)


@triton.jit
def _grouped_tile(pid, num_m, num_n, GROUP_M: tl.constexpr):
    """(token tile, N tile) of program ``pid`` in grouped order: consecutive programs share token tiles (x
    rows of similar ranges) for L2 reuse."""
    width = GROUP_M * num_n
    first_m = (pid // width) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + (pid % width) % size_m, (pid % width) // size_m


@triton.jit
def _finish_k_tile(acc, out_ptrs, ws_tile, ok, b_ptr, rn, nvalid, cnt_ptr, pid, pid_s, M, N,
                   HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Writes a gemm_k tile: directly, or (split-K) its partial to the fp32 workspace ``ws_tile`` (the tile's
    rows, ``M x N`` per split); the tile's last program to arrive sums the partials in split order and writes."""
    if SPLIT == 1:
        if HAS_BIAS:
            acc += tl.load(b_ptr + rn, mask=nvalid, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptrs, acc.to(out_ptrs.dtype.element_ty), mask=ok)
    else:
        tl.store(ws_tile + pid_s * M * N, acc, mask=ok)
        # the atomic releases this program's partial and acquires the others'; the last program resets the
        # counter for the next launch (CUDA-graph replays included). The barrier first: every thread's stores
        # before the one thread's releasing atomic (a release covers only what that thread has seen)
        tl.debug_barrier()
        done = tl.atomic_add(cnt_ptr + pid, 1, sem="acq_rel")
        if done == SPLIT - 1:
            tot = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in tl.static_range(SPLIT):  # fixed order: deterministic
                tot += tl.load(ws_tile + s * M * N, mask=ok, other=0.0, cache_modifier=".cg")
            if HAS_BIAS:
                tot += tl.load(b_ptr + rn, mask=nvalid, other=0.0).to(tl.float32)[None, :]
            tl.store(out_ptrs, tot.to(out_ptrs.dtype.element_ty), mask=ok)
            tl.store(cnt_ptr + pid, 0)


@triton.jit
def _gemm_mn_perm_kernel(
    x_ptr, w_ptr, w2_ptr, b_ptr, out_ptr, perm_ptr, cnt_ptr,
    M, N, K,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_w2n, stride_w2k, stride_om, stride_on,
    GROUP: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr, SWIGLU: tl.constexpr,
    EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_m, pid_n = _grouped_tile(pid, tl.cdiv(M, BLOCK_M), N // BLOCK_N, GROUP_M)

    n0 = pid_n * BLOCK_N
    g = n0 // GROUP
    cnt = tl.load(cnt_ptr + g)
    offs = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    valid = offs < M
    active = offs < cnt
    tok = tl.load(perm_ptr + g * M + offs, mask=valid, other=0).to(tl.int64)
    rn = n0 + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if pid_m * BLOCK_M < cnt:
        x_ptrs = x_ptr + tok[:, None] * stride_xm + rk[None, :] * stride_xk
        w_ptrs = w_ptr + rn[None, :] * stride_wn + rk[:, None] * stride_wk
        w2_ptrs = w2_ptr + rn[None, :] * stride_w2n + rk[:, None] * stride_w2k
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            if EVEN_K:
                a = tl.load(x_ptrs, mask=active[:, None], other=0.0)
                b = tl.load(w_ptrs)
            else:
                kin = rk < K - k * BLOCK_K
                a = tl.load(x_ptrs, mask=active[:, None] & kin[None, :], other=0.0)
                b = tl.load(w_ptrs, mask=kin[:, None], other=0.0)
            acc = tl.dot(a, b, acc)
            if SWIGLU:
                if EVEN_K:
                    b2 = tl.load(w2_ptrs)
                else:
                    b2 = tl.load(w2_ptrs, mask=kin[:, None], other=0.0)
                acc2 = tl.dot(a, b2, acc2)
                w2_ptrs += BLOCK_K * stride_w2k
            x_ptrs += BLOCK_K * stride_xk
            w_ptrs += BLOCK_K * stride_wk

    acc = _mn_epilogue(acc, acc2, b_ptr, rn, active[:, None], HAS_BIAS, ACT, SWIGLU)
    out_ptrs = out_ptr + tok[:, None] * stride_om + rn[None, :] * stride_on
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=valid[:, None])


@triton.jit
def _tile_of(t, ends, sizes, idx, G):
    """Group of the ``t``-th tile of a list laid out group after group (``ends`` = running sums of the
    per-group tile ``sizes``, one lane per group) and the tile's index inside its group."""
    g = tl.sum((ends <= t).to(tl.int32) * (idx < G).to(tl.int32), axis=0)
    start = tl.sum(tl.where(idx == g, ends - sizes, 0), axis=0)
    return g, t - start


@triton.jit
def _weight_tile(w_ptr, rn, kk, stride_n, stride_k, K, EVEN_K: tl.constexpr):
    """The ``[len(kk), len(rn)]`` tile of an ``[N, K]`` weight (columns past K read as zeros)."""
    ptrs = w_ptr + rn[None, :] * stride_n + kk[:, None] * stride_k
    if EVEN_K:
        return tl.load(ptrs)
    return tl.load(ptrs, mask=kk[:, None] < K, other=0.0)


@triton.jit
def _gemm_mn_tiles_kernel(
    x_ptr, w_ptr, w2_ptr, b_ptr, out_ptr, perm_ptr, cnt_ptr,
    M, N, K, num_progs,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_w2n, stride_w2k, stride_om, stride_on,
    GROUP: tl.constexpr, G: tl.constexpr, BLOCK_G: tl.constexpr,
    HAS_BIAS: tl.constexpr, ACT: tl.constexpr, SWIGLU: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Persistent large-M gemm_mn / SwiGLU: ``num_progs`` programs stride over the list of *active* tiles
    (per group: its ceil(count / BLOCK_M) token tiles of the permuted list, times the N tiles of the group,
    token tiles innermost so that programs running side by side share a weight tile), then over the tiles
    of inactive tokens, which only get zeros. Against one program per tile (``_gemm_mn_perm_kernel``) it
    leaves no program slot to tiles that only write zeros and keeps the weight tile of consecutive active tiles
    in L2 (H200 sweep, benchmarks/prefill_gemm_sweep.py). (Tried there and not kept: weight tiles through TMA
    descriptors, Triton's flattened and warp-specialized loops: equal or slower.)"""
    pid = tl.program_id(0)
    NPG: tl.constexpr = GROUP // BLOCK_N
    num_m = tl.cdiv(M, BLOCK_M)
    idx = tl.arange(0, BLOCK_G)
    cnts = tl.load(cnt_ptr + idx, mask=idx < G, other=0)
    act_m = tl.cdiv(cnts, BLOCK_M)  # active token tiles per group
    act_sizes = act_m * NPG
    act_ends = tl.cumsum(act_sizes, axis=0)
    n_act = tl.sum(act_sizes, axis=0)
    rk = tl.arange(0, BLOCK_K)
    for t in range(pid, n_act, num_progs):
        g, j = _tile_of(t, act_ends, act_sizes, idx, G)
        am = tl.sum(tl.where(idx == g, act_m, 0), axis=0)
        cnt = tl.sum(tl.where(idx == g, cnts, 0), axis=0)
        pid_n = g * NPG + j // am
        pid_m = j % am
        n0 = pid_n * BLOCK_N
        offs = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        active = offs < cnt
        tok = tl.load(perm_ptr + g * M + offs, mask=offs < M, other=0).to(tl.int64)
        rn = n0 + tl.arange(0, BLOCK_N)
        x_ptrs = x_ptr + tok[:, None] * stride_xm + rk[None, :] * stride_xk
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            k0 = k * BLOCK_K
            if EVEN_K:
                a = tl.load(x_ptrs + k0 * stride_xk, mask=active[:, None], other=0.0)
            else:
                a = tl.load(x_ptrs + k0 * stride_xk, mask=active[:, None] & (rk[None, :] < K - k0), other=0.0)
            acc = tl.dot(a, _weight_tile(w_ptr, rn, k0 + rk, stride_wn, stride_wk, K, EVEN_K), acc)
            if SWIGLU:
                acc2 = tl.dot(a, _weight_tile(w2_ptr, rn, k0 + rk, stride_w2n, stride_w2k, K, EVEN_K), acc2)
        acc = _mn_epilogue(acc, acc2, b_ptr, rn, active[:, None], HAS_BIAS, ACT, SWIGLU)
        tl.store(out_ptr + tok[:, None] * stride_om + rn[None, :] * stride_on, acc.to(out_ptr.dtype.element_ty),
                 mask=(offs < M)[:, None])
    # the tiles of inactive tokens (past each group's active tiles): zeros
    zero_sizes = (num_m - act_m) * NPG
    zero_ends = tl.cumsum(tl.where(idx < G, zero_sizes, 0), axis=0)
    n_zero = tl.sum(tl.where(idx < G, zero_sizes, 0), axis=0)
    zeros = tl.zeros((BLOCK_M, BLOCK_N), dtype=out_ptr.dtype.element_ty)
    for t in range(pid, n_zero, num_progs):
        g, j = _tile_of(t, zero_ends, zero_sizes, idx, G)
        am = tl.sum(tl.where(idx == g, act_m, 0), axis=0)
        zm = num_m - am
        rn = (g * NPG + j // zm) * BLOCK_N + tl.arange(0, BLOCK_N)
        offs = (am + j % zm) * BLOCK_M + tl.arange(0, BLOCK_M)
        tok = tl.load(perm_ptr + g * M + offs, mask=offs < M, other=0).to(tl.int64)
        tl.store(out_ptr + tok[:, None] * stride_om + rn[None, :] * stride_on, zeros, mask=(offs < M)[:, None])


@triton.jit
def _gemm_mn_direct_kernel(
    x_ptr, w_ptr, w2_ptr, b_ptr, out_ptr, mask_ptr, ws_ptr, cnt_ptr,
    M, N, K,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_w2n, stride_w2k, stride_om, stride_on,
    stride_mm, stride_mg,
    GROUP: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr, SWIGLU: tl.constexpr,
    EVEN_K: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, SWAP: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_s = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    mvalid = rm < M
    rm64 = rm.to(tl.int64)
    keep = tl.load(mask_ptr + rm64[:, None] * stride_mm + (rn // GROUP)[None, :] * stride_mg,
                   mask=mvalid[:, None], other=0) != 0
    needed = tl.max(tl.max(keep.to(tl.int32), axis=1), axis=0) > 0
    # split-K: this program's share of the K chunks (the last program of the tile to arrive finishes it)
    n_chunks = tl.cdiv(K, BLOCK_K)
    per = tl.cdiv(n_chunks, SPLIT)
    lo = pid_s * per
    hi = tl.minimum(lo + per, n_chunks)
    out_ptrs = out_ptr + rm64[:, None] * stride_om + rn[None, :] * stride_on

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if needed:
        if BLOCK_M == 1:
            # GEMV: elementwise products reduced once at the end keep the weight stream simple
            part = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
            part2 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
            x_ptrs = x_ptr + rm64 * stride_xm + (lo * BLOCK_K + rk) * stride_xk
            w_ptrs = w_ptr + rn[:, None] * stride_wn + (lo * BLOCK_K + rk)[None, :] * stride_wk
            w2_ptrs = w2_ptr + rn[:, None] * stride_w2n + (lo * BLOCK_K + rk)[None, :] * stride_w2k
            for k in range(lo, hi):
                if EVEN_K:
                    a = tl.load(x_ptrs)
                    b = tl.load(w_ptrs)
                else:
                    kin = rk < K - k * BLOCK_K
                    a = tl.load(x_ptrs, mask=kin, other=0.0)
                    b = tl.load(w_ptrs, mask=kin[None, :], other=0.0)
                part += b.to(tl.float32) * a.to(tl.float32)[None, :]
                if SWIGLU:
                    if EVEN_K:
                        b2 = tl.load(w2_ptrs)
                    else:
                        b2 = tl.load(w2_ptrs, mask=kin[None, :], other=0.0)
                    part2 += b2.to(tl.float32) * a.to(tl.float32)[None, :]
                    w2_ptrs += BLOCK_K * stride_w2k
                x_ptrs += BLOCK_K * stride_xk
                w_ptrs += BLOCK_K * stride_wk
            acc = tl.expand_dims(tl.sum(part, axis=1), 0)
            acc2 = tl.expand_dims(tl.sum(part2, axis=1), 0)
        elif SWAP:
            # the transposed tile: W [BLOCK_N, BLOCK_K] x x^T [BLOCK_K, BLOCK_M]
            acc_t = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            acc2_t = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            x_ptrs = x_ptr + rm64[None, :] * stride_xm + (lo * BLOCK_K + rk)[:, None] * stride_xk
            w_ptrs = w_ptr + rn[:, None] * stride_wn + (lo * BLOCK_K + rk)[None, :] * stride_wk
            w2_ptrs = w2_ptr + rn[:, None] * stride_w2n + (lo * BLOCK_K + rk)[None, :] * stride_w2k
            for k in range(lo, hi):
                if EVEN_K:
                    a = tl.load(x_ptrs, mask=mvalid[None, :], other=0.0)
                    b = tl.load(w_ptrs)
                else:
                    kin = rk < K - k * BLOCK_K
                    a = tl.load(x_ptrs, mask=mvalid[None, :] & kin[:, None], other=0.0)
                    b = tl.load(w_ptrs, mask=kin[None, :], other=0.0)
                acc_t = tl.dot(b, a, acc_t)
                if SWIGLU:
                    if EVEN_K:
                        b2 = tl.load(w2_ptrs)
                    else:
                        b2 = tl.load(w2_ptrs, mask=kin[None, :], other=0.0)
                    acc2_t = tl.dot(b2, a, acc2_t)
                    w2_ptrs += BLOCK_K * stride_w2k
                x_ptrs += BLOCK_K * stride_xk
                w_ptrs += BLOCK_K * stride_wk
            acc = tl.trans(acc_t)
            acc2 = tl.trans(acc2_t)
        else:
            x_ptrs = x_ptr + rm64[:, None] * stride_xm + (lo * BLOCK_K + rk)[None, :] * stride_xk
            w_ptrs = w_ptr + rn[None, :] * stride_wn + (lo * BLOCK_K + rk)[:, None] * stride_wk
            w2_ptrs = w2_ptr + rn[None, :] * stride_w2n + (lo * BLOCK_K + rk)[:, None] * stride_w2k
            for k in range(lo, hi):
                if EVEN_K:
                    a = tl.load(x_ptrs, mask=mvalid[:, None], other=0.0)
                    b = tl.load(w_ptrs)
                else:
                    kin = rk < K - k * BLOCK_K
                    a = tl.load(x_ptrs, mask=mvalid[:, None] & kin[None, :], other=0.0)
                    b = tl.load(w_ptrs, mask=kin[:, None], other=0.0)
                acc = tl.dot(a, b, acc)
                if SWIGLU:
                    if EVEN_K:
                        b2 = tl.load(w2_ptrs)
                    else:
                        b2 = tl.load(w2_ptrs, mask=kin[:, None], other=0.0)
                    acc2 = tl.dot(a, b2, acc2)
                    w2_ptrs += BLOCK_K * stride_w2k
                x_ptrs += BLOCK_K * stride_xk
                w_ptrs += BLOCK_K * stride_wk

    finish = True
    if SPLIT > 1:
        # partials to the fp32 workspace ([SPLIT, M, N], then the up partials), released by the atomic; the
        # tile's last program sums them in split order (deterministic) and resets the counter (graph replays).
        # A tile no row needs is all zeros: its first program writes them, the others have nothing to do.
        finish = False
        if needed:
            ok = mvalid[:, None] & (rn < N)[None, :]
            ws_tile = ws_ptr + rm64[:, None] * N + rn[None, :]
            tl.store(ws_tile + pid_s * M * N, acc, mask=ok)
            if SWIGLU:
                tl.store(ws_tile + (SPLIT + pid_s) * M * N, acc2, mask=ok)
            tile = pid_m * tl.num_programs(1) + pid_n
            tl.debug_barrier()  # all threads' partials stored before the releasing atomic
            done = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel")
            if done == SPLIT - 1:
                acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for sp in tl.static_range(SPLIT):
                    acc += tl.load(ws_tile + sp * M * N, mask=ok, other=0.0, cache_modifier=".cg")
                    if SWIGLU:
                        acc2 += tl.load(ws_tile + (SPLIT + sp) * M * N, mask=ok, other=0.0, cache_modifier=".cg")
                tl.store(cnt_ptr + tile, 0)
                finish = True
        elif pid_s == 0:
            finish = True
    if finish:
        acc = _mn_epilogue(acc, acc2, b_ptr, rn, keep, HAS_BIAS, ACT, SWIGLU)
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mvalid[:, None])


@triton.jit
def _gemm_k_kernel(
    x_ptr, w_ptr, b_ptr, out_ptr, ws_ptr, cnt_ptr, mask_ptr, glist_ptr, nlist_ptr,
    M, N, K, G,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_om, stride_on, stride_mm, stride_mg,
    GROUP: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, USE_LIST: tl.constexpr,
    LOCAL_LIST: tl.constexpr, BLOCK_G: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SWAP: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_s = tl.program_id(1)
    pid_m, pid_n = _grouped_tile(pid, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)

    CPG: tl.constexpr = GROUP // BLOCK_K  # K chunks per group (list variants only)
    SPAN: tl.constexpr = GROUP % BLOCK_K != 0  # chunks cross group boundaries: per-column decisions
    if USE_LIST:
        # visit only the groups some token needs: dependent loads, but no loop trips for unused groups
        if LOCAL_LIST:
            # this tile's own list, built here from its rows' mask (no launch before this one): the union of
            # the rows' groups, compacted in ascending order into this program's slot of glist_ptr (scratch),
            # read back after a barrier
            gg = tl.arange(0, BLOCK_G)
            gin = gg < G
            rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            use_g = tl.load(mask_ptr + rows.to(tl.int64)[:, None] * stride_mm + gg[None, :] * stride_mg,
                            mask=(rows < M)[:, None] & gin[None, :], other=0)
            need = tl.max((use_g != 0).to(tl.int32), axis=0)
            n_list = tl.sum(need, 0)
            my_list = glist_ptr + (pid * SPLIT + pid_s).to(tl.int64) * BLOCK_G
            tl.store(my_list + tl.cumsum(need, 0) - need, gg, mask=need != 0)
            tl.debug_barrier()
        else:  # the plan's list (one launch per plan, shared by the paired ops)
            n_list = tl.load(nlist_ptr)
            my_list = glist_ptr
        per = tl.cdiv(n_list, SPLIT)
        lo = pid_s * per * CPG
        hi = tl.minimum(pid_s * per + per, n_list) * CPG
    else:
        # affine loop over all K chunks; loads of a group no token in the tile uses are masked off,
        # which moves no bytes and keeps the loop software-pipelined
        n_chunks = K // BLOCK_K
        per = tl.cdiv(n_chunks, SPLIT)
        lo = pid_s * per
        hi = tl.minimum(lo + per, n_chunks)

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    mvalid = rm < M
    nvalid = rn < N
    rm64 = rm.to(tl.int64)
    if BLOCK_M == 1:
        part = tl.zeros((BLOCK_K, BLOCK_N), dtype=tl.float32)
    elif SWAP:
        acc_t = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for i in range(lo, hi):
        if USE_LIST:
            g = tl.load(my_list + i // CPG)
            kk = g * GROUP + (i % CPG) * BLOCK_K + rk
        elif SPAN:
            kk = i * BLOCK_K + rk
            g = kk // GROUP  # per column: the chunk spans several narrow groups
        else:
            kk = i * BLOCK_K + rk
            g = (i * BLOCK_K) // GROUP  # one group per chunk: masks stay uniform along K (16-byte loads)
        if BLOCK_M == 1:
            # the decision broadcast over the chunk (one address per group: cheap, cached)
            use1 = tl.load(mask_ptr + pid_m.to(tl.int64) * stride_mm + g * stride_mg + rk * 0) != 0
            b = tl.load(w_ptr + kk[:, None] * stride_wk + rn[None, :] * stride_wn,
                        mask=nvalid[None, :] & use1[:, None], other=0.0)
            a = tl.load(x_ptr + pid_m.to(tl.int64) * stride_xm + kk * stride_xk, mask=use1, other=0.0)
            part += a.to(tl.float32)[:, None] * b.to(tl.float32)
        elif SPAN:
            use = tl.load(mask_ptr + rm64[:, None] * stride_mm + g[None, :] * stride_mg,
                          mask=mvalid[:, None], other=0) != 0
            col_used = tl.max(use.to(tl.int32), 0)  # [BLOCK_K]: some row of the tile runs this column
            b = tl.load(w_ptr + kk[:, None] * stride_wk + rn[None, :] * stride_wn,
                        mask=nvalid[None, :] & (col_used[:, None] != 0), other=0.0)
            a = tl.load(x_ptr + rm64[:, None] * stride_xm + kk[None, :] * stride_xk, mask=use, other=0.0)
            acc = tl.dot(a, b, acc)
        else:
            use = tl.load(mask_ptr + rm64 * stride_mm + g * stride_mg, mask=mvalid, other=0) != 0
            any_use = tl.max(use.to(tl.int32), 0)
            if SWAP:  # W [BLOCK_N, BLOCK_K] x x^T [BLOCK_K, BLOCK_M]
                b = tl.load(w_ptr + rn[:, None] * stride_wn + kk[None, :] * stride_wk,
                            mask=(nvalid[:, None].to(tl.int32) * any_use) != 0, other=0.0)
                a = tl.load(x_ptr + rm64[None, :] * stride_xm + kk[:, None] * stride_xk,
                            mask=use[None, :], other=0.0)
                acc_t = tl.dot(b, a, acc_t)
            else:
                b = tl.load(w_ptr + kk[:, None] * stride_wk + rn[None, :] * stride_wn,
                            mask=(nvalid[None, :].to(tl.int32) * any_use) != 0, other=0.0)
                # rows whose token skips this group are neither loaded nor counted
                a = tl.load(x_ptr + rm64[:, None] * stride_xm + kk[None, :] * stride_xk,
                            mask=use[:, None], other=0.0)
                acc = tl.dot(a, b, acc)
    if BLOCK_M == 1:
        acc = tl.expand_dims(tl.sum(part, axis=0), 0)
    elif SWAP:
        acc = tl.trans(acc_t)

    _finish_k_tile(acc, out_ptr + rm64[:, None] * stride_om + rn[None, :] * stride_on,
                   ws_ptr + rm64[:, None] * N + rn[None, :], mvalid[:, None] & nvalid[None, :], b_ptr, rn, nvalid,
                   cnt_ptr, pid, pid_s, M, N, HAS_BIAS, SPLIT, BLOCK_M, BLOCK_N)


@triton.jit
def _gemm_k_sorted_kernel(
    x_ptr, w_ptr, b_ptr, out_ptr, ws_ptr, cnt_ptr, mask_ptr, rows_ptr, tlist_ptr, tn_ptr,
    M, N, K, G,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_om, stride_on, stride_mm, stride_mg,
    GROUP: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, X_MASKED: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    # token tile = BLOCK_M consecutive entries of the plan's pattern-sorted token order; its K loop visits
    # only the groups some token of the tile runs (the plan's per-tile compacted list): neither the weight
    # bytes nor the MMAs of the other groups are spent
    pid = tl.program_id(0)
    pid_s = tl.program_id(1)
    pid_m, pid_n = _grouped_tile(pid, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)

    CPG: tl.constexpr = GROUP // BLOCK_K
    n_list = tl.load(tn_ptr + pid_m)
    per = tl.cdiv(n_list, SPLIT)
    lo = pid_s * per * CPG
    hi = tl.minimum(pid_s * per + per, n_list) * CPG

    pos = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # positions in the sorted order
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    mvalid = pos < M
    nvalid = rn < N
    row = tl.load(rows_ptr + pos, mask=mvalid, other=0).to(tl.int64)  # the tokens themselves
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for i in range(lo, hi):
        g = tl.load(tlist_ptr + pid_m.to(tl.int64) * G + i // CPG)
        kk = g * GROUP + (i % CPG) * BLOCK_K + rk
        b = tl.load(w_ptr + kk[:, None] * stride_wk + rn[None, :] * stride_wn, mask=nvalid[None, :], other=0.0)
        if X_MASKED:
            use = mvalid
        else:  # rows whose token skips this group are neither loaded nor counted
            use = tl.load(mask_ptr + row * stride_mm + g * stride_mg, mask=mvalid, other=0) != 0
        a = tl.load(x_ptr + row[:, None] * stride_xm + kk[None, :] * stride_xk, mask=use[:, None], other=0.0)
        acc = tl.dot(a, b, acc)

    # outputs go back to the tokens' own rows; split-K partials stay in sorted positions
    _finish_k_tile(acc, out_ptr + row[:, None] * stride_om + rn[None, :] * stride_on,
                   ws_ptr + pos.to(tl.int64)[:, None] * N + rn[None, :], mvalid[:, None] & nvalid[None, :], b_ptr,
                   rn, nvalid, cnt_ptr, pid, pid_s, M, N, HAS_BIAS, SPLIT, BLOCK_M, BLOCK_N)


@triton.jit
def _mask_columns_kernel(x_ptr, mask_ptr, y_ptr, M, K, stride_xm, stride_xk, stride_mm, stride_mg,
                         GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """``y = x * mask expanded over K groups`` (exact zeros); feeds the dense large-M gemm_k path."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    inb = (rm < M)[:, None] & (rk < K)[None, :]
    rm64 = rm.to(tl.int64)
    keep = tl.load(mask_ptr + rm64[:, None] * stride_mm + (rk // GROUP)[None, :] * stride_mg, mask=inb, other=0) != 0
    x = tl.load(x_ptr + rm64[:, None] * stride_xm + rk[None, :] * stride_xk, mask=inb & keep, other=0.0)
    tl.store(y_ptr + rm64[:, None] * K + rk[None, :], x, mask=inb)


@triton.jit
def _mask_epilogue_kernel(y_ptr, u_ptr, out_ptr, mask_ptr, M, N, stride_mm, stride_mg,
                          GROUP: tl.constexpr, ACT: tl.constexpr, SWIGLU: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Dense-path epilogue: ``out = act(y)`` (or ``silu(y) * u``), exact zeros in masked groups."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    inb = (rm < M)[:, None] & (rn < N)[None, :]
    rm64 = rm.to(tl.int64)
    keep = tl.load(mask_ptr + rm64[:, None] * stride_mm + (rn // GROUP)[None, :] * stride_mg, mask=inb, other=0) != 0
    offs = rm64[:, None] * N + rn[None, :]
    y = tl.load(y_ptr + offs, mask=inb & keep, other=0.0).to(tl.float32)
    if SWIGLU:
        u = tl.load(u_ptr + offs, mask=inb & keep, other=0.0).to(tl.float32)
        y = y * tl.sigmoid(y) * u
    else:
        y = _activation(y, ACT)
    y = tl.where(keep, y, 0.0)
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=inb)


# --------------------------------------------------------------------------------------------------
# configs (Hopper defaults; tiny blocks under the interpreter)
# --------------------------------------------------------------------------------------------------

# M at or below which gemm_mn uses the direct (GEMV / skinny) kernel instead of the permuted one
DIRECT_MAX_M = 64
# large-M gemm_mn / SwiGLU: above this fraction of executed (token, group) pairs, cuBLAS plus a masking
# epilogue beats the permuted Triton kernels (the per-tile one ran at ~2/3 of cuBLAS's rate on the H200, the
# persistent one at 0.8-0.9: 2026-12-01 sweep; the threshold was set for the former and still holds for q)
DENSE_DENSITY = 0.75
DENSE_MIN_M = 1024


_COUNTERS: dict = {}
_RETIRED: list = []  # outgrown counter buffers: a captured CUDA graph may still point at one, so never freed


def arrival_counters(device: torch.device, n: int) -> torch.Tensor:
    """At least ``n`` int32 counters on ``device``, zero between launches: kernels whose programs meet at
    a counter (the last to arrive finishes the work) reset their own. One set per device, so such kernels
    must not run concurrently on two streams of one device.

    The buffer is made (zeroed) eagerly: under CUDA-graph capture a new buffer's zeroing would only be
    recorded, not run, so a capture that needs a new or larger buffer is refused — warm up first (an eager
    call of the same op, as every capture needs anyway for Triton's compilation).
    """
    cnt = _COUNTERS.get(device)
    if cnt is None or cnt.numel() < n:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("wide.kernels: the arrival counters of gemm_k / router_margin are made on the first "
                               "eager call; run the op once eagerly (a warm-up) before capturing a CUDA graph")
        if cnt is not None:
            _RETIRED.append(cnt)
        cnt = _COUNTERS[device] = torch.zeros(max(n, 4096), device=device, dtype=torch.int32)
    return cnt


def dense_density(group: int) -> float:
    """Density above which the dense path wins; narrower groups mean narrower, slower routed tiles
    (H200 run 3, M=4096, 50%: group 128 1.39x, 64 1.03x, 32 0.69x routed vs ~0.92x dense path)."""
    if group >= 128:
        return DENSE_DENSITY
    return {64: 0.55, 32: 0.35}.get(group, 0.2 if group < 32 else DENSE_DENSITY)
# gemm_k above this M goes dense: with independent masks every tile needs every group (see NOTES)
K_PREMASK_MIN_M = 512
# ... unless the plan's pattern-sorted tiles need at most this share of their (tile, group) pairs, and M is
# at least K_SORTED_MIN_M: then gemm_k_sorted. H200, 2026-12-01 (benchmarks/kernels.py --ops gemm_k_sorted,
# down_proj shape): its time is ≈ 1.6 x share x cuBLAS's at M=16384 (share 0.48: 1.34x, 0.52: 1.20x) and
# ≈ 1.6-1.9 x at M=4096 (0.48: 1.10x, 0.62: 0.99x), while building the sorted plan (argsort, gather,
# partition, one host read) took 0.35-0.65 ms eagerly: a clear net win at 16384 (0.67 ms saved), none at
# 4096 (0.06 ms). 8192 lies between, untimed. Independent random masks never qualify (every tile needs
# every group).
K_SORTED_MAX_SHARE = 0.55
K_SORTED_MIN_M = 8192


def _pow2_divisor(n: int, cap: int) -> int:
    """Largest power of two dividing ``n`` and not above ``cap``."""
    d = 1
    while d * 2 <= cap and n % (d * 2) == 0:
        d *= 2
    return d


def for_element_size(config: GemmConfig, element_size: int) -> GemmConfig:
    """A default config for operands of ``element_size`` bytes: the defaults are tuned (and checked against
    sm_90's shared memory, tests/kernels/test_sm90_compile.py) for 2-byte bf16 / fp16, so for fp32 the K
    chunk is halved and each pipeline stage holds the same bytes (an fp32 swiglu tile 16 x 128 x 128 at 4
    stages asked for 408 KiB and failed to launch on the H200). Explicit configs are never changed."""
    bk = config.block_k
    while element_size > 2 and bk > 16:
        bk //= 2
        element_size //= 2
    return config if bk == config.block_k else dataclasses.replace(config, block_k=bk)


def default_mn_config(M: int, N: int, K: int, group: int, swiglu: bool) -> tuple[str, GemmConfig]:
    """(kernel, config) for gemm_mn / SwiGLU: ``"direct"`` for small M, else ``"perm"`` (H200-tuned)."""
    if interpreting():
        if M <= 16:
            return "direct", GemmConfig(1 if M == 1 else 16, 16, 16)
        return "perm", GemmConfig(16, _pow2_divisor(group, 16), 16, persistent=int(persistent_mn()))
    if M == 1:
        # 2026-11-30 H200 sweep, 8B shapes, weights rotated over 8 copies (no L2 reuse): 4 x 512 tiles beat
        # 8 x 512 (q: 7.7 vs 8.2 us) and 16 x 256 (gate/up: 30.5 vs 32.1 us) at 50%, and at 100% too
        return "direct", GemmConfig(1, _pow2_divisor(N, 4), 512, num_warps=4, num_stages=4)
    if M <= 16:
        # the transposed tile (swap: 64 weight rows as the MMA's M side, wgmma): 2026-12-01 sweep at M=16 (no L2
        # reuse, benchmarks/gemv_sweep.py --m 16 --swap-only), coherent 50%: gate/up 30.9-31.5 us vs 32.5-32.8 for
        # the 16 x 128 row tile, q 9.1 vs 10.4-10.6 (split 4 fills the SMs with half the 64-wide tiles skipped);
        # per-token and all-on within noise of the row tiles (gate/up 58.7 / 58.8, q 12.5 / 12.5)
        if not skinny_swap():  # the row tiles (2026-11-30 sweep)
            if swiglu:
                return "direct", GemmConfig(16, _pow2_divisor(N, 128), 128, num_warps=4, num_stages=4)
            return "direct", GemmConfig(16, _pow2_divisor(N, 32), 256, num_warps=4, num_stages=4,
                                        split_k=2 if K >= 2048 else 1)
        if swiglu:
            return "direct", GemmConfig(16, _pow2_divisor(N, 64), 128, num_warps=4, num_stages=4, swap=True)
        return "direct", GemmConfig(16, _pow2_divisor(N, 64), 128, num_warps=4, num_stages=4,
                                    split_k=4 if K >= 2048 else 1, swap=True)
    if M <= DIRECT_MAX_M:
        bm = 32 if M <= 32 else 64
        return "direct", GemmConfig(bm, _pow2_divisor(N, 64), 128, num_warps=4, num_stages=4)
    if M <= 256:
        if swiglu and M <= 128:  # H200 run 2: 70 us at M=128 (dense 75 us)
            return "direct", GemmConfig(128, _pow2_divisor(N, 128), 64, num_warps=8, num_stages=4)
        return "perm", GemmConfig(64, _pow2_divisor(group, 128), 64, num_warps=4, num_stages=4)
    if M >= DENSE_MIN_M and group % 128 == 0 and persistent_mn():
        # the persistent kernel over the active tiles: 2026-12-01 H200 sweep (benchmarks/prefill_gemm_sweep.py),
        # 50% random masks, us at M = 1024 / 4096 / 16384 against the one-program-per-tile kernel: gate/up 242 / 860
        # / 3715 vs 276 / 984 / 3855 (cuBLAS with every group: 357 / 1478 / 5832); q (groups of 512: 256-wide
        # tiles) 53 / 147 / 480 vs 105 / 177 / 537 (cuBLAS 49 / 177 / 837). All groups on, gate/up runs at
        # 0.90-0.92 of cuBLAS's rate at 1024 / 4096 (0.81 at 16384)
        bn = 128 if swiglu else _pow2_divisor(group, 256)
        return "perm", GemmConfig(128, bn, 64, num_warps=8, num_stages=3, persistent=1)
    bm = 256 if M >= 4096 and not swiglu else 128  # run 2: 496 us vs 516 us at M=4096
    return "perm", GemmConfig(bm, _pow2_divisor(group, 128), 64, num_warps=8, num_stages=3)


def default_k_config(M: int, N: int, K: int, group: int) -> GemmConfig:
    if interpreting():
        return GemmConfig(1 if M == 1 else 16, 16, _pow2_divisor(K, 32))
    bk = _pow2_divisor(K, 128)  # the affine loop takes chunks spanning several narrow groups
    if M == 1:
        if group >= 128:
            # GEMV: the compacted group list wastes no loop trips on skipped groups (run 3: 16.3 us, 1.92x;
            # narrow groups make its chunks too small: 32-wide 44.9 us)
            # (2026-11-30 sweep, no L2 reuse: 8 warps 7.8 / 18.8 us for o / down at 50% vs 8.5 / 19.8 with 4)
            # ("local": each program builds the list from the mask row itself, no launch before the GEMV)
            return GemmConfig(1, 32, _pow2_divisor(group, 128), num_warps=8, num_stages=4, split_k=4,
                              variant="local")
        return GemmConfig(1, 32, bk, num_warps=4, num_stages=4, split_k=4)
    if M <= 32:  # chunks inside one group: uniform masks along K keep the loads vectorized
        # the transposed tile (swap, wgmma over 64 weight rows): 2026-12-01 sweep at M=16, coherent 50%: o 8.6 us,
        # down 19.3 (list, 5 stages) vs 10.1 / 20.6 with 16 x 32 row tiles (split 8 for down)
        if not skinny_swap():  # the row tiles (2026-11-30 sweep)
            if group >= 128:
                return GemmConfig(16, 32, _pow2_divisor(group, 128), num_warps=4, num_stages=4,
                                  split_k=8 if K >= 8192 else 4, variant="list")
            return GemmConfig(16, 64, _pow2_divisor(group, 128), num_warps=4, num_stages=4, split_k=4)
        if group >= 128:
            # the needed-group list (the union of the rows' groups): batch-coherent decode masks skip half the
            # loop (2026-11-30 sweep at M=16, 50%: list 10.0 / 20.7 us vs affine 11.1 / 23.8 for o / down).
            # The plan's list, not "local": building it in each program cost more than its launch
            # (2026-12-01, down at 50%: 31.6 us local vs 21.0 list)
            return GemmConfig(16, 64, _pow2_divisor(group, 128), num_warps=4, num_stages=5, split_k=4,
                              variant="list", swap=True)
        bk = _pow2_divisor(group, 128)
        return GemmConfig(16, 64, bk, num_warps=4, num_stages=4, split_k=4, swap=bk >= 64)
    if M < K_PREMASK_MIN_M:
        return GemmConfig(64, 128, _pow2_divisor(group, 64), num_warps=4, num_stages=4, split_k=4)
    return GemmConfig(128, 128, 64, variant="premask")


# decode gemm_k walks a needed-group list (the plan's costs a launch to build) unless the groups some row needs,
# expected from the plan's density hint, are at least this share: near full density the list skips no loop
# trips, and the affine loop was the faster config anyway (H200 sweep, 2026-12-01, M=1 at 100%: o 11.7 us
# affine / 12.0 list, down 31.5 / 32.2 — the list timed without its launch; at 50% the list wins, 8.1 / 18.7
# against 19.9 affine for down; M=16 per-token 50%, where 16 rows need ~every group: down 32.3 affine / 34.4 list)
K_LIST_MAX_HINT = 0.9


def affine_k_config(M: int, N: int, K: int, group: int) -> GemmConfig:
    """The decode gemm_k config with no group list (dense-ish masks): the sweep's best at full density."""
    if interpreting():
        return GemmConfig(1 if M == 1 else 16, 16, _pow2_divisor(K, 32))
    if M == 1:
        return GemmConfig(1, 32, _pow2_divisor(K, 128), num_warps=8, num_stages=4, split_k=4)
    bk = _pow2_divisor(group, 128)
    if bk < 64 or not skinny_swap():  # narrow groups: chunks across groups (per-column decisions), row tiles
        return GemmConfig(16, 64, _pow2_divisor(K, 128), num_warps=4, num_stages=4, split_k=8 if K >= 8192 else 4)
    # the transposed tile (2026-12-01 sweep, M=16 all on: o 12.3 us, down 32.1 vs 12.9 / 32.4 with 16 x 64 row tiles)
    return GemmConfig(16, 64, bk, num_warps=4, num_stages=4, split_k=4, swap=True)


def sorted_k_config(M: int, N: int, K: int, group: int) -> GemmConfig | None:
    """Config of gemm_k_sorted, or ``None`` where its tiles cannot be cut (group not a multiple of 16)."""
    if group % 16:
        return None
    if interpreting():
        return GemmConfig(16, 16, _pow2_divisor(group, 32), variant="sorted")
    return GemmConfig(128, 128, _pow2_divisor(group, 64), num_warps=8, num_stages=3, variant="sorted")


# --------------------------------------------------------------------------------------------------
# host functions
# --------------------------------------------------------------------------------------------------


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


_SMS: dict = {}  # CUDA device index -> SM count (asked per persistent launch; the properties call is not free)


def sm_count(device: torch.device) -> int:
    """SM count of a CUDA device (cached: decode launches ask per call)."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    sms = _SMS.get(idx)
    if sms is None:
        sms = _SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return sms


def _programs(device: torch.device, per_sm: int) -> int:
    if interpreting() or device.type != "cuda":
        return 3  # the interpreter: a few programs, each striding over several tiles
    return sm_count(device) * per_sm


def _gemm_mn_tiles(x, weight, w2, bias, out, perm, counts, group, act, swiglu, cfg):
    M, K = x.shape
    N = weight.shape[0]
    G = N // group
    tiles = triton.cdiv(M, cfg.block_m) * (N // cfg.block_n)
    progs = min(tiles, _programs(x.device, cfg.persistent))
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


def gemm_k(x, weight, bias, out, mask, glist, nlist, group: int, config: GemmConfig,
           workspace: torch.Tensor | None = None, x_masked: bool = False) -> torch.Tensor:
    """Routed reduction-width GEMM: ``out = (x * mask expanded) @ weight^T (+ bias)``.

    Args:
        x: ``[M, K]``; weight: ``[N, K]``; bias: ``[N]`` or ``None``; out: ``[M, N]``.
        mask: ``[M, G_count]`` uint8 view of the bool mask.
        glist: ``[G_count]`` int32 groups some token needs, first (the plan's order); nlist: ``[1]`` int32
            (only read by the ``"list"`` variant; the ``"local"`` variant builds each tile's list in the kernel
            and takes ``None`` for both).
        x_masked: x is already zero in masked groups (the output of gemm_mn/SwiGLU under this mask).
    """
    M, K = x.shape
    N = weight.shape[0]
    cfg = config
    listed = cfg.variant in ("list", "local")
    if listed and group % cfg.block_k:
        raise ValueError(f"block_k={cfg.block_k} must divide the group size {group} ({cfg.variant} variant)")
    if K % cfg.block_k and cfg.variant != "premask":
        raise ValueError(f"block_k={cfg.block_k} must divide K={K}")
    if cfg.variant == "premask":
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
    _gemm_k_kernel[(tiles, split)](
        x, weight, bias if bias is not None else weight, out, workspace, counters, mask, glist, nlist,
        M, N, K, ng,
        x.stride(0), x.stride(1), weight.stride(0), weight.stride(1), out.stride(0), out.stride(1),
        mask.stride(0), mask.stride(1),
        GROUP=group, HAS_BIAS=bias is not None, SPLIT=split, USE_LIST=listed,
        LOCAL_LIST=cfg.variant == "local", BLOCK_G=block_g,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, SWAP=cfg.swap,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out


def gemm_k_sorted(x, weight, bias, out, mask, rows, tile_list, tile_count, group: int, config: GemmConfig,
                  workspace: torch.Tensor | None = None, x_masked: bool = False) -> torch.Tensor:
    """Large-M routed reduction-width GEMM over the plan's pattern-sorted token order
    (``RoutingPlan.tile_order(config.block_m)``): a token tile reads and multiplies only the groups one of
    its tokens runs, so structured masks (tokens that agree on groups) skip work that a tile in sequence
    order would still do.

    Args:
        x, weight, bias, out, mask: as in :func:`gemm_k`.
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
