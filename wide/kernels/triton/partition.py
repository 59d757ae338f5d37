"""The routing plan's Triton kernels (`wide.kernels.plan.RoutingPlan` calls them on CUDA): the stable partition
per (row, group), active tokens first, and the list of groups some row needs.

The eager torch version in `wide.kernels.plan` takes ~10 small launches (~200 us of host time on the
H200, run 1); this kernel does the same in one launch, two passes over each mask column.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _partition_kernel(mask_ptr, perm_ptr, cnt_ptr, T, G, smr, smt, smg, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    r = pid // G
    g = pid % G
    col = mask_ptr + r.to(tl.int64) * smr + g * smg
    total = 0
    for t0 in range(0, T, BLOCK):
        t = t0 + tl.arange(0, BLOCK)
        a = (tl.load(col + t.to(tl.int64) * smt, mask=t < T, other=0) != 0).to(tl.int32)
        total += tl.sum(a, 0)
    before = 0  # active tokens in earlier blocks
    out = perm_ptr + pid.to(tl.int64) * T
    for t0 in range(0, T, BLOCK):
        t = t0 + tl.arange(0, BLOCK)
        inb = t < T
        a = (tl.load(col + t.to(tl.int64) * smt, mask=inb, other=0) != 0).to(tl.int32)
        act_before = before + tl.cumsum(a, 0) - a  # active tokens before t
        dest = tl.where(a != 0, act_before, total + t - act_before)
        tl.store(out + dest, t, mask=inb)
        before += tl.sum(a, 0)
    tl.store(cnt_ptr + pid, total)


def partition(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``mask [R, T, G]`` (bool) -> perm ``[R, G, T]`` int32 (active first, both parts ascending),
    counts ``[R, G]`` int32."""
    R, T, G = mask.shape
    m = mask.view(torch.uint8)
    perm = torch.empty(R, G, T, device=mask.device, dtype=torch.int32)
    counts = torch.empty(R, G, device=mask.device, dtype=torch.int32)
    if R * G and T:
        _partition_kernel[(R * G,)](m, perm, counts, T, G, m.stride(0), m.stride(1), m.stride(2),
                                    BLOCK=1024 if T > 256 else 256, num_warps=4)
    elif R * G:
        counts.zero_()
    return perm, counts


@triton.jit
def _group_list_kernel(mask_ptr, order_ptr, n_ptr, M, G, smm, smg, BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr):
    g = tl.arange(0, BLOCK_G)
    gin = g < G
    need = tl.zeros((BLOCK_G,), dtype=tl.int32)
    for m0 in range(0, M, BLOCK_M):
        rows = m0 + tl.arange(0, BLOCK_M)
        a = tl.load(mask_ptr + rows.to(tl.int64)[:, None] * smm + g[None, :] * smg,
                    mask=(rows < M)[:, None] & gin[None, :], other=0)
        need = tl.maximum(need, tl.max((a != 0).to(tl.int32), axis=0))
    before = tl.cumsum(need, 0) - need  # needed groups before g
    total = tl.sum(need, 0)
    dest = tl.where(need != 0, before, total + g - before)
    tl.store(order_ptr + dest, g, mask=gin)
    tl.store(n_ptr, total)


def group_list(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``mask [M, G]`` (bool) -> the groups some row needs, ascending, then the others (``[G]`` int32), and how
    many are needed (``[1]`` int32): one launch (a decode step builds this per layer and kind; the any-reduce
    and the partition were two)."""
    M, G = mask.shape
    m = mask.view(torch.uint8)
    order = torch.empty(G, device=mask.device, dtype=torch.int32)
    n = torch.empty(1, device=mask.device, dtype=torch.int32)
    if G == 0:
        n.zero_()
        return order, n
    block_g = triton.next_power_of_2(G)
    block_m = max(1, min(triton.next_power_of_2(max(M, 1)), 16, 8192 // block_g))
    _group_list_kernel[(1,)](m, order, n, M, G, m.stride(0), m.stride(1), BLOCK_M=block_m, BLOCK_G=block_g,
                             num_warps=4)
    return order, n
