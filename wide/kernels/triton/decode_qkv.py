"""A decode step's q / k / v projections, RoPE and KV-cache write in one launch (`wide.kernels.decode_qkv`).

transformers runs these as ~10 launches per layer at a decode step (three GEMVs, two RoPE kernels, and a static
cache's ``arange`` + position add + counter bump + two ``index_copy_``); on small models each costs a few µs of
latency whatever its size (H200 profile of the Qwen2.5-1.5B shape at batch 1: ≈ 30 µs of a ≈ 100 µs layer). Here
one program computes one head's ``head_dim`` outputs (a q head only where some row of the step runs its group, every
k and v head) for all rows (up to 16) over a share of the reduction (split-K); the head's last program to arrive sums
the shares in split order (deterministic), adds the bias, rounds to the activations' dtype as the linear would,
rotates q and k (HF's ``rotate_half`` form, in fp32, rounded once), and writes q (zeros for rows that skip the
group) and k / v into the static cache at the position the cache's counter holds. The last head to finish bumps
that counter by one, as transformers' ``StaticLayer.update`` does, so the launch is CUDA-graph safe (no host
read). Without a mask every q head is computed: the attention router may then still be deciding beside this
launch (its side stream), and only the attention and ``o_proj`` wait for it. ``part`` splits the launch in two:
``"kv"`` (k / v, the cache write and the counter bump) beside the router, then ``"q"`` (the routed q heads alone)
once the mask is known — two launches that read only the q heads the rows run
(`KernelOptions.decode_qkv_split`). No library fuses a routed q
projection with RoPE and a cache write; written here for that reason.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import arrival_counters, interpreting
from .tiles import mma


@triton.jit
def _decode_qkv_kernel(
    x_ptr, wq_ptr, wk_ptr, wv_ptr, bq_ptr, bk_ptr, bv_ptr, cos_ptr, sin_ptr, mask_ptr,
    q_ptr, kc_ptr, vc_ptr, pos_ptr, ws_ptr, cnt_ptr,
    M, K, HQ, HK, S, HPG, U0, NU,
    sxm, smm, smg, scm, ssm, sqm, sqh, skb, skh, sks, svb, svh, svs,
    HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr, HALF: tl.constexpr, SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, EAGER_ROPE: tl.constexpr = False, BUMP: tl.constexpr = True,
):
    # the head: q heads [0, HQ), k heads [HQ, HQ + HK), v heads [HQ + HK, HQ + 2 HK); this launch runs the NU heads
    # from U0 on (all of them, the q heads alone or the k / v heads alone); BUMP: it writes the cache (k / v heads)
    # and moves the cache's position on
    u = tl.program_id(0) + U0
    s = tl.program_id(1)  # the share of the reduction
    rm = tl.arange(0, BLOCK_M)
    j = tl.arange(0, HALF)
    rk = tl.arange(0, BLOCK_K)
    mvalid = rm < M
    rm64 = rm.to(tl.int64)
    is_q = u < HQ
    is_k = (u >= HQ) & (u < HQ + HK)
    if is_q:
        w_base = wq_ptr + u.to(tl.int64) * (2 * HALF) * K
        b_base = bq_ptr + u * (2 * HALF)
        if HAS_MASK:  # the rows that run this head's group (a q head no row runs is never read)
            run = tl.load(mask_ptr + rm64 * smm + (u // HPG) * smg, mask=mvalid, other=0) != 0
        else:  # every head (the mask is still being decided beside this launch)
            run = mvalid
    elif is_k:
        w_base = wk_ptr + (u - HQ).to(tl.int64) * (2 * HALF) * K
        b_base = bk_ptr + (u - HQ) * (2 * HALF)
        run = mvalid
    else:
        w_base = wv_ptr + (u - HQ - HK).to(tl.int64) * (2 * HALF) * K
        b_base = bv_ptr + (u - HQ - HK) * (2 * HALF)
        run = mvalid
    needed = tl.max(run.to(tl.int32), axis=0) > 0

    n_chunks = tl.cdiv(K, BLOCK_K)
    per = tl.cdiv(n_chunks, SPLIT)
    lo = s * per
    hi = tl.minimum(lo + per, n_chunks)
    acc_lo = tl.zeros((BLOCK_M, HALF), dtype=tl.float32)  # the head's first and second halves (RoPE pairs them)
    acc_hi = tl.zeros((BLOCK_M, HALF), dtype=tl.float32)
    if needed:
        if BLOCK_M == 1:
            # GEMV: elementwise products, reduced once at the end
            part_lo = tl.zeros((HALF, BLOCK_K), dtype=tl.float32)
            part_hi = tl.zeros((HALF, BLOCK_K), dtype=tl.float32)
            for c in range(lo, hi):
                kk = c * BLOCK_K + rk
                kin = kk < K
                xv = tl.load(x_ptr + kk, mask=kin, other=0.0).to(tl.float32)
                wl = tl.load(w_base + j[:, None] * K + kk[None, :], mask=kin[None, :], other=0.0)
                wh = tl.load(w_base + (j + HALF)[:, None] * K + kk[None, :], mask=kin[None, :], other=0.0)
                part_lo += wl.to(tl.float32) * xv[None, :]
                part_hi += wh.to(tl.float32) * xv[None, :]
            acc_lo = tl.expand_dims(tl.sum(part_lo, axis=1), 0)
            acc_hi = tl.expand_dims(tl.sum(part_hi, axis=1), 0)
        else:  # a batch's rows (16-row tiles, `tl.dot`); rows that skip this q head load no x
            for c in range(lo, hi):
                kk = c * BLOCK_K + rk
                kin = kk < K
                a = tl.load(x_ptr + rm64[:, None] * sxm + kk[None, :], mask=run[:, None] & kin[None, :], other=0.0)
                wl = tl.load(w_base + j[None, :] * K + kk[:, None], mask=kin[:, None], other=0.0)
                wh = tl.load(w_base + (j + HALF)[None, :] * K + kk[:, None], mask=kin[:, None], other=0.0)
                acc_lo = mma(a, wl, acc_lo)
                acc_hi = mma(a, wh, acc_hi)

    if SPLIT > 1:
        # this share's partial to the workspace; the head's last program to arrive sums them in split order
        ws = ws_ptr + ((u * SPLIT + s) * BLOCK_M + rm[:, None]) * (2 * HALF) + j[None, :]
        tl.store(ws, acc_lo)
        tl.store(ws + HALF, acc_hi)
        tl.debug_barrier()  # every thread's stores before the one thread's releasing atomic
        done = tl.atomic_add(cnt_ptr + u, 1, sem="acq_rel")
        last = done == SPLIT - 1
    else:
        last = True
    if last:
        if SPLIT > 1:
            acc_lo = tl.zeros((BLOCK_M, HALF), dtype=tl.float32)
            acc_hi = tl.zeros((BLOCK_M, HALF), dtype=tl.float32)
            for t in tl.static_range(SPLIT):  # fixed order: deterministic
                wt = ws_ptr + ((u * SPLIT + t) * BLOCK_M + rm[:, None]) * (2 * HALF) + j[None, :]
                acc_lo += tl.load(wt, cache_modifier=".cg")
                acc_hi += tl.load(wt + HALF, cache_modifier=".cg")
            tl.store(cnt_ptr + u, 0)  # reset for the next launch (graph replays included)
        if HAS_BIAS:
            acc_lo += tl.load(b_base + j).to(tl.float32)[None, :]
            acc_hi += tl.load(b_base + HALF + j).to(tl.float32)[None, :]
        # the projection's own rounding (an nn.Linear returns the activations' dtype), then RoPE in fp32
        y_lo = acc_lo.to(q_ptr.dtype.element_ty).to(tl.float32)
        y_hi = acc_hi.to(q_ptr.dtype.element_ty).to(tl.float32)
        pos = tl.load(pos_ptr)
        if is_q | is_k:
            c_lo = tl.load(cos_ptr + rm64[:, None] * scm + j[None, :], mask=mvalid[:, None], other=0.0).to(tl.float32)
            c_hi = tl.load(cos_ptr + rm64[:, None] * scm + HALF + j[None, :], mask=mvalid[:, None],
                           other=0.0).to(tl.float32)
            s_lo = tl.load(sin_ptr + rm64[:, None] * ssm + j[None, :], mask=mvalid[:, None], other=0.0).to(tl.float32)
            s_hi = tl.load(sin_ptr + rm64[:, None] * ssm + HALF + j[None, :], mask=mvalid[:, None],
                           other=0.0).to(tl.float32)
            # x * cos + rotate_half(x) * sin, rotate_half(x) = [-x_hi, x_lo]
            if EAGER_ROPE:  # each product rounded to the activations' dtype, then the sum (eager transformers)
                dt = q_ptr.dtype.element_ty
                r_lo = (y_lo * c_lo).to(dt).to(tl.float32) + (-(y_hi * s_lo)).to(dt).to(tl.float32)
                r_hi = (y_hi * c_hi).to(dt).to(tl.float32) + (y_lo * s_hi).to(dt).to(tl.float32)
            else:
                r_lo = y_lo * c_lo - y_hi * s_lo
                r_hi = y_hi * c_hi + y_lo * s_hi
        else:
            r_lo = y_lo
            r_hi = y_hi
        if is_q:
            dst = q_ptr + rm64[:, None] * sqm + u * sqh + j[None, :]
            keep = run[:, None]
            tl.store(dst, tl.where(keep, r_lo, 0.0).to(q_ptr.dtype.element_ty), mask=mvalid[:, None])
            tl.store(dst + HALF, tl.where(keep, r_hi, 0.0).to(q_ptr.dtype.element_ty), mask=mvalid[:, None])
        else:
            # a write past the cache's end is dropped (HF's would raise)
            inb = mvalid[:, None] & ((pos + j[None, :] * 0) < S)
            if is_k:
                dst = kc_ptr + rm64[:, None] * skb + (u - HQ) * skh + pos * sks + j[None, :]
            else:
                dst = vc_ptr + rm64[:, None] * svb + (u - HQ - HK) * svh + pos * svs + j[None, :]
            tl.store(dst, r_lo.to(kc_ptr.dtype.element_ty), mask=inb)
            tl.store(dst + HALF, r_hi.to(kc_ptr.dtype.element_ty), mask=inb)
        if BUMP:
            # the launch's last head to finish moves the cache's write position on (every head read it above)
            tl.debug_barrier()
            heads_done = tl.atomic_add(cnt_ptr + HQ + 2 * HK, 1, sem="acq_rel")
            if heads_done == NU - 1:
                tl.store(pos_ptr, pos + 1)
                tl.store(cnt_ptr + HQ + 2 * HK, 0)


MAX_ROWS = 16
"""Rows one launch takes (a decode batch: one 16-row `tl.dot` tile; one row takes the GEMV)."""


def _split(units: int, chunks: int, masked: bool) -> int:
    """Shares of the reduction per head, a power of two: about 1.5 programs per SM of an H100 / H200 over every q
    head, 3 when a mask leaves half of them out (2026-12-03 sweep, `benchmarks/decode_qkv_sweep.py`)."""
    want = max(1, (384 if masked else 192) // max(units, 1))
    return max(1, min(triton.next_power_of_2(want), triton.next_power_of_2(chunks)))


def decode_qkv(x: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, v_weight: torch.Tensor,
               mask: torch.Tensor, q_bias, k_bias, v_bias, cos: torch.Tensor, sin: torch.Tensor,
               k_cache: torch.Tensor, v_cache: torch.Tensor, position: torch.Tensor,
               out: torch.Tensor | None = None, config: tuple[int, ...] | None = None,
               eager_rope: bool = False, part: str = "all") -> torch.Tensor | None:
    """See `wide.kernels.decode_qkv` (shapes checked there). Returns q ``[B, 1, Hq, D]`` (``None`` for ``part="kv"``).
    ``config``: ``(split, block_k, num_warps)`` or ``(split, block_k, num_warps, num_stages)`` instead of the
    defaults (triton's own stage count unless given; `benchmarks/decode_qkv_sweep.py`)."""
    B, K = x.shape[0], x.shape[-1]
    x2 = x.reshape(B, K)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    hd = k_cache.shape[-1]
    hq, hk = q_weight.shape[0] // hd, k_weight.shape[0] // hd
    if part == "kv":
        mask = None  # (k / v heads run for every row)
    m2 = mask.reshape(B, mask.shape[-1]).view(torch.uint8) if mask is not None else x2
    # HF's rotary embedding gives one row when the position ids have one (every row at the same position)
    c2, s2 = cos.reshape(-1, hd).expand(B, hd), sin.reshape(-1, hd).expand(B, hd)
    q = out if out is not None else torch.empty(B, 1, hq, hd, device=x.device, dtype=x.dtype)
    u0, units = {"all": (0, hq + 2 * hk), "q": (0, hq), "kv": (hq, 2 * hk)}[part]
    # every q head: 128-wide chunks, 8 warps; a mask: 64-wide chunks (twice the splits where the chunks cap them), 8
    # warps from K = 4096, else 4 — each shape's fastest of the 2026-12-03 H200 sweep (µs: 8B shape every q head
    # 18.1, half of them 13.5 (14.5 with 128-wide chunks); Qwen2.5-1.5B 6.4 / 4.8 (5.4); SmolLM2 4.6 / 4.7 (5.2);
    # `benchmarks/decode_qkv_sweep.py`)
    masked = mask is not None
    block_k = 32 if interpreting() else (64 if masked else 128)
    split = _split(units, triton.cdiv(K, block_k), masked)
    warps, stages = (4 if masked and K < 4096 else 8), {}
    if config is not None:
        split, block_k, warps, *rest = config
        stages = {"num_stages": rest[0]} if rest else {}
    if B > MAX_ROWS:
        raise ValueError(f"decode_qkv (triton): at most {MAX_ROWS} rows per launch, got {B}")
    block_m = 1 if B == 1 else 16
    # (indexed by the head over all of them: the "q" / "kv" launches share the layout)
    ws = torch.empty((hq + 2 * hk) * split * block_m * hd, device=x.device, dtype=torch.float32) if split > 1 else q
    # its own counters: without a mask this launch runs beside the attention router (side stream), whose kernel
    # meets at the shared ones
    cnt = arrival_counters(x.device, hq + 2 * hk + 1, owner="decode_qkv")
    has_bias = q_bias is not None
    _decode_qkv_kernel[(units, split)](
        x2, q_weight, k_weight, v_weight, q_bias if has_bias else x2, k_bias if has_bias else x2,
        v_bias if has_bias else x2, c2, s2, m2, q, k_cache, v_cache, position, ws, cnt,
        B, K, hq, hk, k_cache.shape[2], hq // mask.shape[-1] if mask is not None else 1, u0, units,
        x2.stride(0), m2.stride(0), m2.stride(1), c2.stride(0), s2.stride(0), q.stride(0), q.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
        v_cache.stride(2),
        HAS_BIAS=has_bias, HAS_MASK=mask is not None, HALF=hd // 2, SPLIT=split, BLOCK_M=block_m, BLOCK_K=block_k,
        EAGER_ROPE=bool(eager_rope), BUMP=part != "q", num_warps=warps, **stages)
    return None if part == "kv" else q
