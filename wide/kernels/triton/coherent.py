"""Batch-coherent decode's shared selection (Triton): the EMA of the batch's execute probabilities, the top-k (or
adaptive) choice of the groups every row runs, its refresh schedule and the run-first group list, in one launch
(`coherent_select`); `coherent_step` is also the last step of `router.coherent_route`'s launch, after the rows'
margins (`wide.kernels.coherent_select` / `coherent_route` say what is computed)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def coherent_blocks(B: int, G: int) -> tuple[int, int, int]:
    """(BLOCK_G, BLOCK_J, BLOCK_B) of the selection step over ``B`` rows of ``G`` groups."""
    block_g = max(16, triton.next_power_of_2(G))
    # up to 128 groups: one [G, G] comparison from the same registers; more: blocks of the stored EMA
    block_j = block_g if block_g <= 128 else max(16, min(block_g, 8192 // block_g))
    block_b = max(2, min(triton.next_power_of_2(B), 4096 // block_g))  # 2D margin tiles of <= 4096
    return block_g, block_j, block_b


@triton.jit
def _updated_ema(m_ptr, ema_ptr, idx, inb, B, smb, weight, BLOCK_B: tl.constexpr, FRESH: tl.constexpr):
    # groups ``idx``: lerp(ema, mean_b sigmoid(margin[b]), weight) with torch.lerp's two formulas (exact at
    # both ends). The rows are read BLOCK_B at a time, one 2D load each (a load per row, in a loop, left the
    # kernel waiting on memory B times per pass: 8.7 us at 16 rows x 112 groups on the H200)
    p = tl.zeros(idx.shape, dtype=tl.float32)
    for b0 in range(0, B, BLOCK_B):
        b = b0 + tl.arange(0, BLOCK_B)
        bin_ = b < B
        if FRESH:  # margins other programs of this launch just wrote: read past L1
            m = tl.load(m_ptr + b[:, None] * smb + idx[None, :], mask=bin_[:, None] & inb[None, :], other=0.0,
                        cache_modifier=".cg")
        else:
            m = tl.load(m_ptr + b[:, None] * smb + idx[None, :], mask=bin_[:, None] & inb[None, :], other=0.0)
        p += tl.sum(tl.where(bin_[:, None], tl.sigmoid(m.to(tl.float32)), 0.0), axis=0)
    p = p / B
    old = tl.load(ema_ptr + idx, mask=inb, other=0.0)
    return tl.where(weight < 0.5, old + weight * (p - old), p - (p - old) * (1.0 - weight))


@triton.jit
def _coherent_kernel(m_ptr, ema_ptr, sel_ptr, step_ptr, order_ptr, n_ptr, B, G, smb, weight, keep, refresh_every,
                     scale64, ADAPTIVE: tl.constexpr, LIST: tl.constexpr, BLOCK_G: tl.constexpr,
                     BLOCK_J: tl.constexpr, BLOCK_B: tl.constexpr):
    # one program: G is the number of groups of one layer and kind (tens to hundreds)
    coherent_step(m_ptr, ema_ptr, sel_ptr, step_ptr, order_ptr, n_ptr, B, G, smb, weight, keep, refresh_every,
                   scale64, ADAPTIVE, LIST, BLOCK_G, BLOCK_J, BLOCK_B, False)


@triton.jit
def coherent_step(m_ptr, ema_ptr, sel_ptr, step_ptr, order_ptr, n_ptr, B, G, smb, weight, keep, refresh_every,
                   scale64, ADAPTIVE: tl.constexpr, LIST: tl.constexpr, BLOCK_G: tl.constexpr,
                   BLOCK_J: tl.constexpr, BLOCK_B: tl.constexpr, FRESH: tl.constexpr):
    # the selection step, run by one program (the coherent kernel's, or the router kernel's last one)
    g = tl.arange(0, BLOCK_G)
    gin = g < G
    e = _updated_ema(m_ptr, ema_ptr, g, gin, B, smb, weight, BLOCK_B, FRESH)
    tl.store(ema_ptr + g, e, mask=gin)
    # rank of each group by the new EMA, ties to the lower index; both sides of every comparison must be the
    # same value (a group whose two copies differed in the last bit broke the ranking: H200, 16 rows x 448
    # groups, 2026-12-01, when each j-block recomputed its EMA from a differently shaped tile)
    if BLOCK_J == BLOCK_G:  # one block: both sides from the same registers
        ahead = (e[None, :] > e[:, None]) | ((e[None, :] == e[:, None]) & (g[None, :] < g[:, None]))
        rank = tl.sum((ahead & gin[None, :]).to(tl.int32), axis=1)
    else:  # j-blocks read the stored EMA back after a barrier (one program), and so does this side
        tl.debug_barrier()
        e = tl.load(ema_ptr + g, mask=gin, other=0.0)
        rank = tl.zeros([BLOCK_G], dtype=tl.int32)
        for j0 in range(0, G, BLOCK_J):
            j = j0 + tl.arange(0, BLOCK_J)
            jin = j < G
            ej = tl.load(ema_ptr + j, mask=jin, other=0.0)
            ahead = (ej[None, :] > e[:, None]) | ((ej[None, :] == e[:, None]) & (j[None, :] < g[:, None]))
            rank += tl.sum((ahead & jin[None, :]).to(tl.int32), axis=1)
    if ADAPTIVE:  # keep = the rows' mean count of executing groups x scale64 / 64, rounded half up, in [1, G]
        runs = tl.zeros([BLOCK_G], dtype=tl.int32)
        for b0 in range(0, B, BLOCK_B):
            b = b0 + tl.arange(0, BLOCK_B)
            ok = (b < B)[:, None] & gin[None, :]
            if FRESH:
                mb = tl.load(m_ptr + b[:, None] * smb + g[None, :], mask=ok, other=-1.0, cache_modifier=".cg")
            else:
                mb = tl.load(m_ptr + b[:, None] * smb + g[None, :], mask=ok, other=-1.0)
            runs += tl.sum(((mb >= 0) & ok).to(tl.int32), axis=0)
        total = tl.sum(runs, axis=0).to(tl.int64)
        keep = tl.minimum(tl.maximum((2 * scale64 * total + 64 * B) // (128 * B), 1), G)
    step = tl.load(step_ptr)
    fresh = (rank < keep).to(tl.uint8)
    sel = tl.load(sel_ptr + g, mask=gin, other=0)
    sel = tl.where(step % refresh_every == 0, fresh, sel)
    tl.store(sel_ptr + g, sel, mask=gin)
    tl.store(step_ptr, step + 1)
    if LIST:  # the selection's groups, ascending, then the others (RoutingPlan.group_list's layout)
        need = ((sel != 0) & gin).to(tl.int32)
        before = tl.cumsum(need, 0) - need
        n = tl.sum(need, 0)
        tl.store(order_ptr + tl.where(need != 0, before, n + g - before), g, mask=gin)
        tl.store(n_ptr, n)


def coherent_select(margin: torch.Tensor, ema: torch.Tensor, selection: torch.Tensor, step: torch.Tensor,
                    keep: int | None, memory: float, refresh_every: int, keep_scale: float = 1.0,
                    groups: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """In place over ``ema`` / ``selection`` / ``step`` (and ``groups``); see `wide.kernels.coherent_select`."""
    B, G = margin.shape
    if G:
        block_g, block_j, block_b = coherent_blocks(B, G)
        order, n = groups if groups is not None else (step, step)
        _coherent_kernel[(1,)](margin, ema, selection.view(torch.uint8), step, order, n, B, G, margin.stride(0),
                               1.0 - float(memory), int(keep) if keep is not None else 0, int(refresh_every),
                               round(keep_scale * 64), ADAPTIVE=keep is None, LIST=groups is not None,
                               BLOCK_G=block_g, BLOCK_J=block_j, BLOCK_B=block_b, num_warps=4)
    elif groups is not None:
        groups[1].zero_()
    return selection
