"""Routed attention on Triton: prefill over (query token x head group) and split-K decode: the host functions
that pick the path and config (`attention_prefill`, `attention_decode`), the configs, the kernels.

Prefill paths: dense SDPA with the skipped heads zeroed for long prompts with dense masks (the plan's hint or,
eagerly, its measured density), else the routed kernel over the plan's per-(row, group) permutation.

Prefill: one program per (batch row, *unit*, query tile). A unit is the set of query heads that share
one KV head and one routing group (``min(group size, q heads per kv head)`` heads), so a tile packs
``BLOCK_M // HU_P`` tokens x ``HU`` heads against one K/V stream (GQA packing; ``HU_P`` is ``HU`` rounded up
to a power of two, the extra rows are masked, or ``HU`` itself with ``AttentionConfig.pack``). Tokens come from the
plan's per-(row, group) permutation: a tile holds active tokens only, its causal bound is the last
token's position, keys visible to every row of the tile run without masks, and tiles past the group's
count write zeros for the inactive tokens they cover.

Decode: flash-decoding. Programs (split, batch row x KV head) skip entirely, reading no K/V, when none
of the KV head's query heads executes in that row; a second kernel combines the splits in a fixed
order (deterministic) and writes zeros for inactive heads. With few splits (``AttentionConfig.fold``, the
default for many (row, KV head) pairs) the last split program of each pair to arrive combines them instead,
all at once, and no second launch runs. (One program walking many splits in turn was slower on the H200 on
2026-12-01: 27 us a layer at batch 1 with 65 splits against 8.3 us for the two launches.)
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ..options import KernelOptions, kernel_options
from ..plan import RoutingPlan, plan_for
from .common import arrival_counters, capturing, interpreting, sm_count
from .tiles import mma

LOG2E = 1.4426950408889634


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
    block_m: int = 128
    block_n: int = 64
    num_warps: int = 8
    num_stages: int = 3
    splits: int = 0  # decode only: 0 = pick from the problem size
    # decode only: the last split program of each (row, KV head) combines the splits (no second launch); taken
    # up to FOLD_MAX_SPLITS splits (one program combining many splits in turn was slower than the second launch)
    fold: bool = False
    # prefill only: a token's HU heads take HU consecutive rows of a tile (BLOCK_M // HU tokens a tile, at most
    # HU - 1 dead rows at its end) instead of HU rounded up to a power of two (3 or 6 heads a unit: a quarter of
    # every tile's rows dead); the same tiles, fewer of them
    pack: bool = False


@triton.jit
def _prefill_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, perm_ptr, cnt_ptr, len_ptr, qoff_ptr,
    T, S, qk_scale, N_UNITS,
    sqb, sqt, sqh, sqd, skb, sks, skh, skd, svb, svs, svh, svd, sob, sot, soh, sod,
    spb, spg, scb, scg,
    HU: tl.constexpr, HU_P: tl.constexpr, QPK: tl.constexpr, GSIZE: tl.constexpr, CAUSAL: tl.constexpr,
    HAS_LEN: tl.constexpr, HAS_QOFF: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HEAD_D: tl.constexpr,
):
    # a token's HU heads sit in HU_P consecutive rows (HU rounded up to a power of two, or HU itself: packed);
    # rows past HU of a token and rows past the tile's last whole token are dead
    TILE_T: tl.constexpr = BLOCK_M // HU_P
    pid_bu = tl.program_id(0)
    tile = tl.num_programs(1) - 1 - tl.program_id(1)  # late (long causal) tiles start first
    b = pid_bu // N_UNITS
    u = pid_bu % N_UNITS
    head0 = u * HU
    kvh = head0 // QPK
    grp = head0 // GSIZE
    cnt = tl.load(cnt_ptr + b * scb + grp * scg)

    r = tl.arange(0, BLOCK_M)
    idx = tile * TILE_T + r // HU_P
    slot = r % HU_P
    heads = head0 + slot
    live = slot < HU
    if TILE_T * HU_P < BLOCK_M:  # packed, BLOCK_M not a multiple of HU (compile time: the padded path is unchanged)
        live = live & (r < TILE_T * HU_P)
    valid = (idx < T) & live
    act = (idx < cnt) & live
    perm_row = perm_ptr + b * spb + grp * spg
    tok = tl.load(perm_row + idx, mask=idx < T, other=0)
    d = tl.arange(0, HEAD_D)
    q_rows = q_ptr + b.to(tl.int64) * sqb + tok.to(tl.int64) * sqt + heads * sqh
    o_rows = o_ptr + b.to(tl.int64) * sob + tok.to(tl.int64) * sot + heads * soh

    acc = tl.zeros((BLOCK_M, HEAD_D), dtype=tl.float32)
    if tile * TILE_T < cnt:
        q = tl.load(q_rows[:, None] + d[None, :] * sqd, mask=act[:, None], other=0.0)
        kv_len = S
        if HAS_LEN:
            kv_len = tl.minimum(tl.load(len_ptr + b), S)
        off = S - T
        if HAS_QOFF:  # a prompt chunk over a cache: its first query sits at the row's own offset
            off = tl.load(qoff_ptr + b)
        qpos = tok + off
        if CAUSAL:
            tok_first = tl.load(perm_row + tile * TILE_T)
            tok_last = tl.load(perm_row + tl.minimum(tile * TILE_T + TILE_T, cnt) - 1)
            hi = tl.minimum(tok_last + off + 1, kv_len)
            full = tl.minimum(tok_first + off + 1, kv_len)
        else:
            hi = kv_len
            full = kv_len
        full = (full // BLOCK_N) * BLOCK_N
        m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
        l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
        n = tl.arange(0, BLOCK_N)
        k_base = k_ptr + b.to(tl.int64) * skb + kvh * skh
        v_base = v_ptr + b.to(tl.int64) * svb + kvh * svh
        # keys every row of the tile sees: no masks
        for start in range(0, full, BLOCK_N):
            kpos = start + n
            k = tl.load(k_base + kpos[:, None] * sks + d[None, :] * skd)
            s = mma(q, tl.trans(k), None) * qk_scale
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_base + kpos[:, None] * svs + d[None, :] * svd)
            acc = mma(p.to(v.dtype), v, acc * alpha[:, None])
            m_i = m_new
        # the causal diagonal band and the padded tail
        for start in range(full, hi, BLOCK_N):
            kpos = start + n
            kin = kpos < kv_len
            k = tl.load(k_base + kpos[:, None] * sks + d[None, :] * skd, mask=kin[:, None], other=0.0)
            s = mma(q, tl.trans(k), None) * qk_scale
            ok = kin[None, :]
            if CAUSAL:
                ok = ok & (kpos[None, :] <= qpos[:, None])
            s = tl.where(ok, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_safe)
            p = tl.exp2(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_base + kpos[:, None] * svs + d[None, :] * svd, mask=kin[:, None], other=0.0)
            acc = mma(p.to(v.dtype), v, acc * alpha[:, None])
            m_i = m_new
        acc = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    acc = tl.where(act[:, None], acc, 0.0)
    tl.store(o_rows[:, None] + d[None, :] * sod, acc.to(o_ptr.dtype.element_ty), mask=valid[:, None])


@triton.jit
def _decode_split_kernel(
    q_ptr, k_ptr, v_ptr, mask_ptr, len_ptr, ws_o_ptr, ws_ml_ptr, o_ptr, cnt_ptr,
    S, chunk, qk_scale, HQ, HK, SPLITS,
    sqb, sqh, sqd, skb, sks, skh, skd, svb, svs, svh, svd, smb, smg, sob, soh, sod,
    QPK: tl.constexpr, GSIZE: tl.constexpr, HAS_LEN: tl.constexpr, QB: tl.constexpr,
    BLOCK_N: tl.constexpr, HEAD_D: tl.constexpr, FOLD: tl.constexpr, SPLITS_P2: tl.constexpr,
):
    # FOLD: the (row, KV head)'s last split program to arrive (an arrival counter) combines the splits itself,
    # all at once ([heads, splits, D] in registers: few splits only), and split 0 writes the zeros of the heads
    # no split computes; otherwise _decode_reduce_kernel does both
    pid_s = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // HK
    kvh = pid_bh % HK
    r = tl.arange(0, QB)
    hvalid = r < QPK
    heads = kvh * QPK + r
    act = (tl.load(mask_ptr + b * smb + (heads // GSIZE) * smg, mask=hvalid, other=0) != 0) & hvalid
    any_act = tl.max(act.to(tl.int32), 0) > 0
    kv_len = S
    if HAS_LEN:
        kv_len = tl.minimum(tl.load(len_ptr + b), S)
    start = pid_s * chunk
    end = tl.minimum(start + chunk, kv_len)
    d = tl.arange(0, HEAD_D)
    n_valid = tl.cdiv(kv_len, chunk)  # splits holding keys of this row
    if FOLD:
        if pid_s == 0:
            dead = hvalid & ((act & (n_valid > 0)) == 0)
            tl.store(o_ptr + b.to(tl.int64) * sob + heads[:, None] * soh + d[None, :] * sod,
                     tl.zeros((QB, HEAD_D), dtype=o_ptr.dtype.element_ty), mask=dead[:, None])
    if any_act & (start < end):
        n = tl.arange(0, BLOCK_N)
        q = tl.load(q_ptr + b.to(tl.int64) * sqb + heads[:, None] * sqh + d[None, :] * sqd,
                    mask=act[:, None], other=0.0)
        k_base = k_ptr + b.to(tl.int64) * skb + kvh * skh
        v_base = v_ptr + b.to(tl.int64) * svb + kvh * svh
        m_i = tl.full((QB,), float("-inf"), dtype=tl.float32)
        l_i = tl.zeros((QB,), dtype=tl.float32)
        acc = tl.zeros((QB, HEAD_D), dtype=tl.float32)
        for s0 in range(start, end, BLOCK_N):
            kpos = s0 + n
            kin = kpos < end
            k = tl.load(k_base + kpos[:, None] * sks + d[None, :] * skd, mask=kin[:, None], other=0.0)
            s = mma(q, tl.trans(k), None) * qk_scale
            s = tl.where(kin[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: every block has a valid key
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_base + kpos[:, None] * svs + d[None, :] * svd, mask=kin[:, None], other=0.0)
            acc = mma(p.to(v.dtype), v, acc * alpha[:, None])
            m_i = m_new
        slot = (b * HQ + heads) * SPLITS + pid_s
        tl.store(ws_o_ptr + slot.to(tl.int64)[:, None] * HEAD_D + d[None, :], acc, mask=act[:, None])
        tl.store(ws_ml_ptr + slot * 2, m_i, mask=act)
        tl.store(ws_ml_ptr + slot * 2 + 1, l_i, mask=act)
        if FOLD:
            tl.debug_barrier()  # every thread's partial stored before the releasing atomic
            done = tl.atomic_add(cnt_ptr + pid_bh, 1, sem="acq_rel")
            if done == n_valid - 1:
                sp = tl.arange(0, SPLITS_P2)
                ok = act[:, None] & (sp < n_valid)[None, :]
                slots = (b * HQ + heads)[:, None] * SPLITS + sp[None, :]
                m = tl.load(ws_ml_ptr + slots * 2, mask=ok, other=float("-inf"), cache_modifier=".cg")
                l = tl.load(ws_ml_ptr + slots * 2 + 1, mask=ok, other=0.0, cache_modifier=".cg")
                m_max = tl.max(m, 1)
                w = tl.where(ok, tl.exp2(m - tl.where(act, m_max, 0.0)[:, None]), 0.0)
                o = tl.load(ws_o_ptr + slots.to(tl.int64)[:, :, None] * HEAD_D + d[None, None, :],
                            mask=ok[:, :, None], other=0.0, cache_modifier=".cg")
                den = tl.sum(w * l, 1)
                out = tl.sum(w[:, :, None] * o, 1) / tl.where(act, den, 1.0)[:, None]
                tl.store(o_ptr + b.to(tl.int64) * sob + heads[:, None] * soh + d[None, :] * sod,
                         out.to(o_ptr.dtype.element_ty), mask=act[:, None])
                tl.store(cnt_ptr + pid_bh, 0)


@triton.jit
def _decode_reduce_kernel(
    ws_o_ptr, ws_ml_ptr, mask_ptr, len_ptr, o_ptr,
    S, chunk, HQ, SPLITS, smb, smg, sob, soh, sod,
    GSIZE: tl.constexpr, HAS_LEN: tl.constexpr, SPLITS_P2: tl.constexpr, HEAD_D: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # one program per (row, head, slice of head_dim): many small programs finish this pass fast
    pid = tl.program_id(0)
    b = pid // HQ
    h = pid % HQ
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    act = tl.load(mask_ptr + b * smb + (h // GSIZE) * smg) != 0
    kv_len = S
    if HAS_LEN:
        kv_len = tl.minimum(tl.load(len_ptr + b), S)
    n_valid = tl.cdiv(kv_len, chunk)
    out = tl.zeros((BLOCK_D,), dtype=tl.float32)
    if act & (n_valid > 0):
        sp = tl.arange(0, SPLITS_P2)
        ok = sp < n_valid
        slot = (b * HQ + h) * SPLITS + sp
        m = tl.load(ws_ml_ptr + slot * 2, mask=ok, other=float("-inf"))
        l = tl.load(ws_ml_ptr + slot * 2 + 1, mask=ok, other=0.0)
        m_max = tl.max(m, 0)
        w = tl.where(ok, tl.exp2(m - m_max), 0.0)
        o = tl.load(ws_o_ptr + slot.to(tl.int64)[:, None] * HEAD_D + d[None, :], mask=ok[:, None], other=0.0)
        out = tl.sum(w[:, None] * o, 0) / tl.sum(w * l, 0)
    tl.store(o_ptr + b.to(tl.int64) * sob + h * soh + d * sod, out.to(o_ptr.dtype.element_ty))


# --------------------------------------------------------------------------------------------------
# configs and host functions
# --------------------------------------------------------------------------------------------------


def default_prefill_config(T: int, D: int, element_size: int = 2,
                           options: KernelOptions | None = None) -> AttentionConfig:
    """H200-tuned for bf16 / fp16; 4-byte operands keep to 64 x 64 tiles (128 x 128 fp32 tiles of D=128 ask
    for 448 KiB of shared memory, twice what an SM has). ``options`` (default: the current `kernel_options`) may
    pack the heads of a unit (``attn_pack``)."""
    tiles = _prefill_tiles(T, D, element_size)
    return dataclasses.replace(tiles, pack=True) if (options or kernel_options()).attn_pack else tiles


def _prefill_tiles(T: int, D: int, element_size: int) -> AttentionConfig:
    if interpreting():
        return AttentionConfig(block_m=16, block_n=16, num_warps=4, num_stages=1)
    if D <= 64:
        # SmolLM2-135M's heads (9 q / 3 kv, D=64) at half the groups, H100, 2026-12-06 (prefill_attention_sweep.py;
        # the old 128 x 64 / 4 warps for every T: 22.2 / 75.6 / 522 us at T = 1k / 4k / 16k): 64 x 128 / 4 warps
        # 16.7 / 47.9 us up to 8k, 128 x 64 / 8 warps 492 us at 16k. 4-byte operands keep the old tiles.
        if element_size > 2:
            return AttentionConfig(block_m=128, block_n=64, num_warps=4, num_stages=3)
        if T <= 8192:
            return AttentionConfig(block_m=64, block_n=128, num_warps=4, num_stages=3)
        return AttentionConfig(block_m=128, block_n=64, num_warps=8, num_stages=3)
    # H200, run 1: 64x64/4 warps 172 us at T=4096; 128x128/8 warps 2.32 ms at T=16384
    if T <= 8192 or element_size > 2:
        return AttentionConfig(block_m=64, block_n=64, num_warps=4, num_stages=3)
    return AttentionConfig(block_m=128, block_n=128, num_warps=8, num_stages=3)


# decode attention's expected density from which the all-heads config is taken (default_decode_config)
DECODE_DENSE_DENSITY = 0.9


def default_decode_config(B: int, HK: int, S: int, D: int, device=None, density: float | None = None,
                          options: KernelOptions | None = None) -> AttentionConfig:
    """``density``: the expected share of executing (row, group) pairs (``None``: about half); ``options`` (default:
    the current `kernel_options`) may switch the folded combine off."""
    if interpreting():
        return AttentionConfig(block_n=16, num_warps=4, num_stages=1, splits=3)
    # short per-program loops (few rows: many splits) want a shallow pipeline, long ones a deeper one
    # (H200: S=32768 b1 22.8 us with 2 stages vs 24.1 with 3; b16 257 us with 3 vs 321 with 2)
    splits = decode_splits(B, HK, S, 64, torch.device(device) if device is not None else torch.device("cuda"))
    if B * HK >= 64:
        # many (row, kv head) pairs: half the splits, 8 warps (H200 sweep 2026-12-01, batch 16 x 8 kv heads, 4097
        # keys, half the heads: 40.6 us with 4 splits / 8 warps / 3 stages against 44.1 with 9 / 4 / 3); with
        # ~every head running, 4 warps and 2 stages (third session's full sweep: 69.6 us against 72.6 all on,
        # but >= 42 against 40.9 at half)
        # The splits combined in the last split program (fold, no second launch): fourth session's sweep, batch 16,
        # 4 splits: 39.9 us against 40.8 at half the heads, 68.2 against 69.7 all on (4 warps, 2 stages); at
        # batches 1 and 4 (33-65 splits) the second launch stays (fewer splits with fold were slower there)
        fold = (options or kernel_options()).decode_fold
        if density is not None and density >= DECODE_DENSE_DENSITY:
            return AttentionConfig(block_n=64, num_warps=4, num_stages=2, splits=max(1, splits // 2), fold=fold)
        return AttentionConfig(block_n=64, num_warps=8, num_stages=3, splits=max(1, splits // 2), fold=fold)
    iters = triton.cdiv(S, splits * 64)
    return AttentionConfig(block_n=64, num_warps=4, num_stages=2 if iters <= 8 else 3)


def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return sm_count(device)
    return 4


def attention_prefill_routed(q, k, v, out, perm, counts, lengths, gsize: int, causal: bool, scale: float,
                             config: AttentionConfig, q_offset=None) -> torch.Tensor:
    """Routed prefill attention over the plan's per-(row, group) token permutation.

    Args:
        q: ``[B, T, Hq, D]``; k, v: ``[B, S, Hk, D]`` (any strides); out: ``[B, T, Hq, D]``, fully written.
        perm: ``[B, G_count, T]`` int32 per-row token permutation (active first); counts: ``[B, G_count]``.
        lengths: ``[B]`` int32 valid KV length per row, or ``None``.
        q_offset: ``[B]`` int32 key position of each row's first query (default ``S - T``), or ``None``.
        gsize: query heads per routing group.
    """
    B, T, HQ, D = q.shape
    S, HK = k.shape[1], k.shape[2]
    qpk = HQ // HK
    hu = min(gsize, qpk)
    cfg = config
    # rows a token takes: its unit's heads, packed, or padded to a power of two (3, 6 or 7 heads pad to 4, 8, 8)
    hu_p = hu if cfg.pack else triton.next_power_of_2(hu)
    if cfg.pack and cfg.block_m < hu:
        raise ValueError(f"block_m={cfg.block_m} must hold one token's {hu} heads per unit")
    if not cfg.pack and cfg.block_m % hu_p:
        raise ValueError(f"block_m={cfg.block_m} must be a multiple of the padded heads per unit {hu_p}")
    n_units = HQ // hu
    tile_t = cfg.block_m // hu_p
    grid = (B * n_units, triton.cdiv(T, tile_t))
    _prefill_kernel[grid](
        q, k, v, out, perm, counts, lengths if lengths is not None else counts,
        q_offset if q_offset is not None else counts, T, S, scale * LOG2E, n_units,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(),
        perm.stride(0), perm.stride(1), counts.stride(0), counts.stride(1),
        HU=hu, HU_P=hu_p, QPK=qpk, GSIZE=gsize, CAUSAL=causal, HAS_LEN=lengths is not None,
        HAS_QOFF=q_offset is not None, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, HEAD_D=D,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out


# prefill attention at or above this mask density runs dense SDPA and masks its output: the routed kernel at
# full density took 2.79 ms against flash's 2.17 ms (8 layers, T=4096, H200, 2026-11-30), so it only wins
# below ~0.78 of the pairs (it scales with the density: 171 us at 50% against flash's 505 us in kernel_table.py)
PREFILL_DENSE_DENSITY = 0.8
# ... for prompts at least this long (shorter ones: attention is a small share, the routed kernel is kept)
PREFILL_DENSE_MIN_T = 1024


def attention_prefill_dense(q, k, v, out, mask, gsize: int, causal: bool, scale: float,
                            all_active: bool = False) -> torch.Tensor:
    """High-density path of routed prefill attention: PyTorch SDPA (flash / cuDNN on the GPU) over every
    head, then the inactive head groups zeroed (skipped when ``all_active``). Same layouts as
    :func:`attention_prefill_routed`; ``mask`` is the ``[B, T, G_count]`` bool mask; keys as long as the queries
    (``S == T``), no per-row lengths."""
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       is_causal=causal, scale=scale, enable_gqa=q.shape[2] != k.shape[2])
    o = o.transpose(1, 2)
    if all_active:
        return out.copy_(o)
    keep = mask.repeat_interleave(gsize, -1).unsqueeze(-1).to(o.dtype)
    return torch.mul(o, keep, out=out)


# AttentionConfig.fold at most this many splits: the combining program holds [heads, splits, D] at once
FOLD_MAX_SPLITS = 16


def decode_splits(B: int, HK: int, S: int, block_n: int, device: torch.device) -> int:
    """Splits of the key axis so that about four programs per SM exist when half the heads run."""
    want = triton.cdiv(8 * _sm_count(device), B * HK)
    return max(1, min(want, triton.cdiv(S, block_n), 256))


def attention_decode_splits(q, k, v, out, mask, lengths, gsize: int, scale: float, config: AttentionConfig,
                            workspace: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Routed decode attention (one query per row) over splits of the key axis.

    Args:
        q: ``[B, 1, Hq, D]``; k, v: ``[B, S, Hk, D]`` (any strides); out: ``[B, 1, Hq, D]``, fully written.
        mask: ``[B, G_count]`` uint8 view of the bool head-group mask.
        lengths: ``[B]`` int32 valid KV length per row (right-padded cache) or ``None`` (all ``S``).
    """
    B, _, HQ, D = q.shape
    S, HK = k.shape[1], k.shape[2]
    qpk = HQ // HK
    cfg = config
    splits = cfg.splits or decode_splits(B, HK, S, cfg.block_n, q.device)
    chunk = triton.cdiv(triton.cdiv(S, splits), cfg.block_n) * cfg.block_n
    splits = triton.cdiv(S, chunk)
    if workspace is None:
        ws_o = torch.empty(B * HQ * splits * D, device=q.device, dtype=torch.float32)
        ws_ml = torch.empty(B * HQ * splits * 2, device=q.device, dtype=torch.float32)
    else:
        ws_o, ws_ml = workspace
    lens = lengths if lengths is not None else mask
    qb = max(16, triton.next_power_of_2(qpk))
    fold = cfg.fold and splits <= FOLD_MAX_SPLITS
    splits_p2 = max(2, triton.next_power_of_2(splits))
    _decode_split_kernel[(splits, B * HK)](
        q, k, v, mask, lens, ws_o, ws_ml, out, arrival_counters(q.device, B * HK) if fold else mask,
        S, chunk, scale * LOG2E, HQ, HK, splits,
        q.stride(0), q.stride(2), q.stride(3), *k.stride(), *v.stride(), mask.stride(0), mask.stride(1),
        out.stride(0), out.stride(2), out.stride(3),
        QPK=qpk, GSIZE=gsize, HAS_LEN=lengths is not None, QB=qb, BLOCK_N=cfg.block_n, HEAD_D=D,
        FOLD=fold, SPLITS_P2=splits_p2, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if fold:
        return out
    block_d = min(D, 32)
    _decode_reduce_kernel[(B * HQ, D // block_d)](
        ws_o, ws_ml, mask, lens, out,
        S, chunk, HQ, splits, mask.stride(0), mask.stride(1), out.stride(0), out.stride(2), out.stride(3),
        GSIZE=gsize, HAS_LEN=lengths is not None, SPLITS_P2=splits_p2,
        HEAD_D=D, BLOCK_D=block_d, num_warps=4,
    )
    return out


def default_scale(D: int) -> float:
    return 1.0 / math.sqrt(D)


def attention_prefill(q, k, v, mask, causal: bool, scale: float | None, lengths, q_offset, plan: RoutingPlan | None,
                      out, config: AttentionConfig | None = None) -> torch.Tensor:
    """Routed prefill attention (`wide.kernels.attention_prefill`'s arguments): SDPA for dense masks on long
    prompts, else the routed kernel; ``config`` forces the routed kernel with that config."""
    B, T, HQ, D = q.shape
    out = out if out is not None else torch.empty_like(q)
    if B == 0 or T == 0:
        return out
    scale = scale if scale is not None else default_scale(D)
    gsize = HQ // mask.shape[-1]
    plan = plan_for(mask, plan)
    if config is None and lengths is None and q_offset is None and k.shape[1] == T and T >= PREFILL_DENSE_MIN_T:
        # dense masks (0% routing, say): SDPA beats the routed kernel; the choice reads the plan's hint
        # (no host read, capture-safe) or, eagerly, its measured density (shared with q_proj's plan)
        if (plan.density_hint is not None or not capturing(q)) and \
                plan.expected_density() >= PREFILL_DENSE_DENSITY:
            all_active = not capturing(q) and plan.known_all_active()
            return attention_prefill_dense(q, k, v, out, mask, gsize, causal, scale, all_active)
    perm, counts = plan.token_order(flat=False)
    cfg = config if config is not None else default_prefill_config(T, D, q.element_size())
    lens = lengths.to(torch.int32) if lengths is not None else None
    offs = q_offset.to(torch.int32) if q_offset is not None else None
    return attention_prefill_routed(q, k, v, out, perm, counts, lens, gsize, causal, scale, cfg, q_offset=offs)


def attention_decode(q, k, v, mask, lengths, scale: float | None, out, config: AttentionConfig | None = None,
                     density: float | None = None, options: KernelOptions | None = None) -> torch.Tensor:
    """Routed decode attention (`wide.kernels.attention_decode`'s arguments); the config from the problem size and
    the expected ``density`` unless ``config`` is given (``options``: as in `default_decode_config`)."""
    B, _, HQ, D = q.shape
    out = out if out is not None else torch.empty_like(q)
    if B == 0:
        return out
    S, HK = k.shape[1], k.shape[2]
    cfg = config if config is not None else default_decode_config(B, HK, S, D, q.device, density, options)
    scale = scale if scale is not None else default_scale(D)
    mask2 = mask.reshape(B, -1).view(torch.uint8)
    lens = lengths.to(torch.int32) if lengths is not None else None
    return attention_decode_splits(q, k, v, out, mask2, lens, HQ // mask.shape[-1], scale, cfg)
