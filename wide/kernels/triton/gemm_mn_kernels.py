"""The output-width routed GEMM's ``@triton.jit`` kernels (`gemm_mn`, fused SwiGLU); launched only by the host
functions in `wide.kernels.triton.gemm_mn`.

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
  ``GemmConfig.swap`` computes the transposed tile, 64 weight rows as the MMA's M side and the tokens as its
  N side, so that Hopper's wgmma takes it (16-row tiles fall back to mma.sync).
- ``_mask_epilogue_kernel``: the dense path's pass after cuBLAS (large M at high mask density).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .tiles import grouped_tile, mma


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
def _gemm_mn_perm_kernel(
    x_ptr, w_ptr, w2_ptr, b_ptr, out_ptr, perm_ptr, cnt_ptr,
    M, N, K,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_w2n, stride_w2k, stride_om, stride_on,
    GROUP: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr, SWIGLU: tl.constexpr,
    EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_m, pid_n = grouped_tile(pid, tl.cdiv(M, BLOCK_M), N // BLOCK_N, GROUP_M)

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
            acc = mma(a, b, acc)
            if SWIGLU:
                if EVEN_K:
                    b2 = tl.load(w2_ptrs)
                else:
                    b2 = tl.load(w2_ptrs, mask=kin[:, None], other=0.0)
                acc2 = mma(a, b2, acc2)
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
            acc = mma(a, _weight_tile(w_ptr, rn, k0 + rk, stride_wn, stride_wk, K, EVEN_K), acc)
            if SWIGLU:
                acc2 = mma(a, _weight_tile(w2_ptr, rn, k0 + rk, stride_w2n, stride_w2k, K, EVEN_K), acc2)
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
                acc_t = mma(b, a, acc_t)
                if SWIGLU:
                    if EVEN_K:
                        b2 = tl.load(w2_ptrs)
                    else:
                        b2 = tl.load(w2_ptrs, mask=kin[None, :], other=0.0)
                    acc2_t = mma(b2, a, acc2_t)
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
                acc = mma(a, b, acc)
                if SWIGLU:
                    if EVEN_K:
                        b2 = tl.load(w2_ptrs)
                    else:
                        b2 = tl.load(w2_ptrs, mask=kin[:, None], other=0.0)
                    acc2 = mma(a, b2, acc2)
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
