"""The reduction-width routed GEMM's ``@triton.jit`` kernels (`gemm_k`); launched only by the host functions in
`wide.kernels.triton.gemm_k`.

- ``_gemm_k_kernel``: grid over (N tile, token tile, K split); optionally adds a residual stream in its epilogue
  (a decode step's ``o_proj`` / ``down_proj`` with the layer's residual add), and (``ROUTE``, one row) the next
  RMSNorm and router over the written row (`gemm_k_route`). Its K loop is either affine over all
  chunks, with loads of groups no token in the tile runs masked off (no bytes move), or runs over the
  plan's compacted list of needed groups (the GEMV default: no loop trips on skipped groups). x rows of
  tokens that skip a group are never loaded. Split-K partials go to an fp32 workspace; the tile's last
  program to arrive (an atomic counter per tile) sums them in split order and writes the output, so the
  sum is deterministic and needs no second launch. ``GemmConfig.swap``: the transposed skinny tile (wgmma).
- ``_gemm_k_sorted_kernel`` (large M, structured masks): tokens in the plan's pattern-sorted order (one
  permutation per mask, gathered on load and scattered on store), each token tile walking its own compacted
  list of needed groups.
- ``_mask_columns_kernel``: the dense path's masking pass before cuBLAS (large M: with independent random
  masks every tile needs every group).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .router import rms_norm_row, router_second_stage
from .tiles import grouped_tile, mma


@triton.jit
def _finish_k_tile(acc, out_ptrs, ws_tile, ok, b_ptr, rn, nvalid, cnt_ptr, pid, pid_s, M, N,
                   HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   res_ptrs, HAS_RES: tl.constexpr):
    """Writes a gemm_k tile: directly, or (split-K) its partial to the fp32 workspace ``ws_tile`` (the tile's
    rows, ``M x N`` per split); the tile's last program to arrive sums the partials in split order and writes.
    ``HAS_RES``: the tile of ``res_ptrs`` (a residual stream) is added to the rounded projection, as a separate add
    would (a router downstream reads the sum: the same bits keep its decisions). Returns (the tile as written, in
    fp32 after its rounding; whether this program wrote it)."""
    if SPLIT == 1:
        if HAS_BIAS:
            acc += tl.load(b_ptr + rn, mask=nvalid, other=0.0).to(tl.float32)[None, :]
        if HAS_RES:  # the projection rounded first, then the add: the separate add's bits
            res = tl.load(res_ptrs, mask=ok, other=0.0).to(tl.float32)
            acc = acc.to(out_ptrs.dtype.element_ty).to(tl.float32) + res
        tl.store(out_ptrs, acc.to(out_ptrs.dtype.element_ty), mask=ok)
        val = acc
        wrote = pid >= 0
    else:
        tl.store(ws_tile + pid_s * M * N, acc, mask=ok)
        # the atomic releases this program's partial and acquires the others'; the last program resets the
        # counter for the next launch (CUDA-graph replays included). The barrier first: every thread's stores
        # before the one thread's releasing atomic (a release covers only what that thread has seen)
        tl.debug_barrier()
        done = tl.atomic_add(cnt_ptr + pid, 1, sem="acq_rel")
        tot = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if done == SPLIT - 1:
            for s in tl.static_range(SPLIT):  # fixed order: deterministic
                tot += tl.load(ws_tile + s * M * N, mask=ok, other=0.0, cache_modifier=".cg")
            if HAS_BIAS:
                tot += tl.load(b_ptr + rn, mask=nvalid, other=0.0).to(tl.float32)[None, :]
            if HAS_RES:
                tot = tot.to(out_ptrs.dtype.element_ty).to(tl.float32) + tl.load(res_ptrs, mask=ok,
                                                                                   other=0.0).to(tl.float32)
            tl.store(out_ptrs, tot.to(out_ptrs.dtype.element_ty), mask=ok)
            tl.store(cnt_ptr + pid, 0)
        val = tot
        wrote = done == SPLIT - 1
    return val.to(out_ptrs.dtype.element_ty).to(tl.float32), wrote


@triton.jit
def _route_row(y, rn, nvalid, tile_n, NT, N, row_ptr, down_ptr, sdr, up_ptr, sug, rbias_ptr, gamma_ptr, ynorm_ptr,
               dec_ptr, part_ptr, rcnt_ptr, R, RG, eps, norm_eps,
               NORMALIZE: tl.constexpr, HAS_UP: tl.constexpr, HAS_RBIAS: tl.constexpr, BLOCK_R: tl.constexpr,
               BLOCK_RG: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    """`gemm_k_route`'s epilogue for one output row (a batch-1 decode step): ``y [1, BLOCK_N]`` is this tile's
    share of the new residual stream (fp32, as stored). Each tile adds its columns' share of the router's first
    GEMV and of the sum of squares to a partial; the row's last tile to arrive (one counter) sums them in tile
    order (deterministic), writes the next layer norm's output (HF RMSNorm, reading the row back) and the router's
    decisions, as `rms_norm_route` does from the stored row."""
    r = tl.arange(0, BLOCK_R)
    rin = r < R
    yv = tl.where(nvalid[None, :], y, 0.0)
    w = tl.load(down_ptr + r[:, None] * sdr + rn[None, :], mask=rin[:, None] & nvalid[None, :], other=0.0)
    h = tl.sum(w.to(tl.float32) * yv, axis=1)
    sq = tl.sum(tl.sum(yv * yv, axis=1), axis=0)
    base = part_ptr + tile_n * (BLOCK_R + 1)
    tl.store(base + r, h)
    tl.store(base + BLOCK_R, sq)
    tl.debug_barrier()  # every thread's stores (the row's tile too) before the one thread's releasing atomic
    done = tl.atomic_add(rcnt_ptr, 1, sem="acq_rel")
    if done == NT - 1:
        hs = tl.zeros([BLOCK_R], dtype=tl.float32)
        ss = tl.zeros([BLOCK_T], dtype=tl.float32)
        for t0 in range(0, NT, BLOCK_T):  # tiles in fixed order: deterministic
            t = t0 + tl.arange(0, BLOCK_T)
            tin = t < NT
            hs += tl.sum(tl.load(part_ptr + t[:, None] * (BLOCK_R + 1) + r[None, :], mask=tin[:, None], other=0.0,
                                 cache_modifier=".cg"), axis=0)
            ss += tl.load(part_ptr + t * (BLOCK_R + 1) + BLOCK_R, mask=tin, other=0.0, cache_modifier=".cg")
        sq_all = tl.sum(ss, axis=0)
        tl.store(rcnt_ptr, 0)  # reset for the next launch (graph replays included)
        # the stored row's norm (written by the launch's other tiles too) and the router's rest, as the router kernel
        rms_norm_row(row_ptr, gamma_ptr, ynorm_ptr, N, tl.rsqrt(sq_all / N + norm_eps), BLOCK_D, True)
        if NORMALIZE:  # rms(x) @ W^T == (x @ W^T) / rms(x)
            hs = hs * tl.rsqrt(sq_all / N + eps)
        router_second_stage(hs, r, rin, up_ptr, sug, rbias_ptr, dec_ptr, RG, HAS_UP, HAS_RBIAS, True, BLOCK_RG)


@triton.jit
def _warm_route_operands(q, P, pid_s, pid_n, N, R, RG, down_ptr, sdr, up_ptr, sug, bias_ptr, gamma_ptr,
                         SPLIT: tl.constexpr, BLOCK_N: tl.constexpr, HAS_UP: tl.constexpr, HAS_BIAS: tl.constexpr,
                         GEPL: tl.constexpr, UEPL: tl.constexpr, BLOCK_W: tl.constexpr):
    """`KernelOptions.route_warm`: loads, at a program's start, one element of each 128-byte line that the ``ROUTE``
    epilogue's serial tail reads later, so that those lines sit in L2 (``evict_last``) when the tail needs them.
    Program ``q`` of ``P`` takes lines ``q, q + P, ...`` of the operands only the row's last tile reads (the next
    norm's weight, ``GEPL`` elements a line; the router's ``up`` and bias, ``UEPL``), and rows ``pid_s, pid_s +
    SPLIT, ...`` of its own tile's columns of the router's ``down``. Returns a ``[BLOCK_W]`` fp32 vector the caller
    consumes in a store that never runs (``lane + N < 0``), so the loads stay and nothing waits on them before the end."""
    l = tl.arange(0, BLOCK_W)
    j = q + P * l
    lg = tl.cdiv(N, GEPL)
    v = tl.load(gamma_ptr + j * GEPL, mask=j < lg, other=0.0, eviction_policy="evict_last").to(tl.float32)
    ju = j - lg
    lu = 0
    if HAS_UP:
        lu = tl.cdiv((RG - 1) * sug + R, UEPL)  # up's last row ends R elements past its start
        v += tl.load(up_ptr + ju * UEPL, mask=(ju >= 0) & (ju < lu), other=0.0,
                     eviction_policy="evict_last").to(tl.float32)
    if HAS_BIAS:
        jb = ju - lu
        v += tl.load(bias_ptr + jb * UEPL, mask=(jb >= 0) & (jb < tl.cdiv(RG, UEPL)), other=0.0,
                     eviction_policy="evict_last").to(tl.float32)
    r = pid_s + SPLIT * l
    v += tl.load(down_ptr + r.to(tl.int64) * sdr + pid_n * BLOCK_N, mask=r < R, other=0.0,
                 eviction_policy="evict_last").to(tl.float32)
    return v


@triton.jit
def _gemm_k_kernel(
    x_ptr, w_ptr, b_ptr, out_ptr, ws_ptr, cnt_ptr, mask_ptr, glist_ptr, nlist_ptr, r_ptr,
    M, N, K, G,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_om, stride_on, stride_mm, stride_mg, stride_rm, stride_rn,
    GROUP: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, SPLIT: tl.constexpr, USE_LIST: tl.constexpr,
    LOCAL_LIST: tl.constexpr, BLOCK_G: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SWAP: tl.constexpr,
    # `gemm_k_route` (ROUTE, one row): the router, the next norm's weight and outputs, partials and counter
    rdown_ptr, rup_ptr, rbias_ptr, gamma_ptr, ynorm_ptr, dec_ptr, rpart_ptr, rcnt_ptr, R, RG, sdr, sug, reps, neps,
    ROUTE: tl.constexpr = False, R_NORMALIZE: tl.constexpr = True, R_HAS_UP: tl.constexpr = False,
    R_HAS_BIAS: tl.constexpr = False, BLOCK_R: tl.constexpr = 16, BLOCK_RG: tl.constexpr = 16,
    BLOCK_T: tl.constexpr = 16, BLOCK_D: tl.constexpr = 16,
    R_WARM: tl.constexpr = False, R_GEPL: tl.constexpr = 64, R_UEPL: tl.constexpr = 32, BLOCK_W: tl.constexpr = 16,
):
    pid = tl.program_id(0)
    pid_s = tl.program_id(1)
    pid_m, pid_n = grouped_tile(pid, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    if ROUTE:
        if R_WARM:  # the epilogue's tail operands into L2 while the K loop streams the weight
            warm = _warm_route_operands(pid * SPLIT + pid_s, tl.num_programs(0) * SPLIT, pid_s, pid_n, N, R, RG,
                                        rdown_ptr, sdr, rup_ptr, sug, rbias_ptr, gamma_ptr, SPLIT, BLOCK_N, R_HAS_UP,
                                        R_HAS_BIAS, R_GEPL, R_UEPL, BLOCK_W)

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
        # the splits share the listed groups' chunks (a few wide groups, o_proj's 512 channels, still feed every
        # split)
        n_chunks = n_list * CPG
        per = tl.cdiv(n_chunks, SPLIT)
        lo = pid_s * per
        hi = tl.minimum(lo + per, n_chunks)
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
            acc = mma(a, b, acc)
        else:
            use = tl.load(mask_ptr + rm64 * stride_mm + g * stride_mg, mask=mvalid, other=0) != 0
            any_use = tl.max(use.to(tl.int32), 0)
            if SWAP:  # W [BLOCK_N, BLOCK_K] x x^T [BLOCK_K, BLOCK_M]
                b = tl.load(w_ptr + rn[:, None] * stride_wn + kk[None, :] * stride_wk,
                            mask=(nvalid[:, None].to(tl.int32) * any_use) != 0, other=0.0)
                a = tl.load(x_ptr + rm64[None, :] * stride_xm + kk[:, None] * stride_xk,
                            mask=use[None, :], other=0.0)
                acc_t = mma(b, a, acc_t)
            else:
                b = tl.load(w_ptr + kk[:, None] * stride_wk + rn[None, :] * stride_wn,
                            mask=(nvalid[None, :].to(tl.int32) * any_use) != 0, other=0.0)
                # rows whose token skips this group are neither loaded nor counted
                a = tl.load(x_ptr + rm64[:, None] * stride_xm + kk[None, :] * stride_xk,
                            mask=use[:, None], other=0.0)
                acc = mma(a, b, acc)
    if BLOCK_M == 1:
        acc = tl.expand_dims(tl.sum(part, axis=0), 0)
    elif SWAP:
        acc = tl.trans(acc_t)

    y, wrote = _finish_k_tile(acc, out_ptr + rm64[:, None] * stride_om + rn[None, :] * stride_on,
                              ws_ptr + rm64[:, None] * N + rn[None, :], mvalid[:, None] & nvalid[None, :], b_ptr, rn,
                              nvalid, cnt_ptr, pid, pid_s, M, N, HAS_BIAS, SPLIT, BLOCK_M, BLOCK_N,
                              r_ptr + rm64[:, None] * stride_rm + rn[None, :] * stride_rn, HAS_RES)
    if ROUTE:  # (one row: the tile's writer adds its share of the next norm and router)
        if wrote:
            _route_row(y, rn, nvalid, pid_n, tl.cdiv(N, BLOCK_N), N, out_ptr, rdown_ptr, sdr, rup_ptr, sug, rbias_ptr,
                       gamma_ptr, ynorm_ptr, dec_ptr, rpart_ptr, rcnt_ptr, R, RG, reps, neps, R_NORMALIZE, R_HAS_UP,
                       R_HAS_BIAS, BLOCK_R, BLOCK_RG, BLOCK_T, BLOCK_D)
        if R_WARM:  # consumes the warm loads in a store that never runs (N > 0; opaque to the compiler)
            w_l = tl.arange(0, BLOCK_W)
            tl.store(ynorm_ptr + w_l, warm.to(ynorm_ptr.dtype.element_ty), mask=w_l + N < 0)


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
    pid_m, pid_n = grouped_tile(pid, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)

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
        acc = mma(a, b, acc)

    # outputs go back to the tokens' own rows; split-K partials stay in sorted positions
    out_ptrs = out_ptr + row[:, None] * stride_om + rn[None, :] * stride_on
    _finish_k_tile(acc, out_ptrs, ws_ptr + pos.to(tl.int64)[:, None] * N + rn[None, :],
                   mvalid[:, None] & nvalid[None, :], b_ptr, rn, nvalid, cnt_ptr, pid, pid_s, M, N, HAS_BIAS, SPLIT,
                   BLOCK_M, BLOCK_N, out_ptrs, False)


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
