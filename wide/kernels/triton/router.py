"""Routing decisions in one launch each (Triton): the low-rank router's margin (with the layer's norm, or with the
coherent top-k of `coherent.py` after it, in the same launch).

Decode steps are launch-bound: the eager router (RMS norm, two small GEMMs, a comparison) costs ~6
launches per layer and kind, the batch-coherent selection (sigmoid, batch mean, EMA, top-k, scatter,
schedule) ~8. Each kernel here does the same work in one launch, so they pay where launches dominate:
decode batches, up to ``KERNEL_MAX_ROWS`` rows (a prefill's rows go to cuBLAS:
`_router_margin_rows`). The margin kernel spreads each row's first GEMV over up to 64
programs (one program per row read the whole router on one SM: 19 us against 12 us for the six torch
launches, H200).
"""

from __future__ import annotations

import weakref

import torch
import triton
import triton.language as tl

from ..options import kernel_options
from .coherent import coherent_blocks, coherent_step
from .common import arrival_counters, capturing


@triton.jit
def rms_norm_row(row_ptr, gamma_ptr, y_ptr, D, inv, BLOCK_D: tl.constexpr, PAST_L1: tl.constexpr):
    """HF Llama / Qwen RMSNorm of one row given its ``inv = rsqrt(mean(x32^2) + eps)``: ``weight * (x32 *
    inv).to(dtype)``, the product in fp32 and rounded once. ``PAST_L1``: the row was written by other programs of
    the launch (read at L2)."""
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        din = d < D
        if PAST_L1:
            xv = tl.load(row_ptr + d, mask=din, other=0.0, cache_modifier=".cg").to(tl.float32)
        else:
            xv = tl.load(row_ptr + d, mask=din, other=0.0).to(tl.float32)
        gv = tl.load(gamma_ptr + d, mask=din, other=0.0).to(tl.float32)
        yv = gv * (xv * inv).to(y_ptr.dtype.element_ty).to(tl.float32)
        tl.store(y_ptr + d, yv.to(y_ptr.dtype.element_ty), mask=din)


@triton.jit
def router_stage_operands(up_ptr, sug, bias_ptr, g, gin, r, rin, HAS_UP: tl.constexpr, HAS_BIAS: tl.constexpr):
    """The second stage's operands for the groups ``g``: ``up``'s rows over the rank and the bias (each ``0.0``
    where the router has none)."""
    if HAS_UP:
        u = tl.load(up_ptr + g[:, None] * sug + r[None, :], mask=gin[:, None] & rin[None, :], other=0.0)
    else:
        u = 0.0
    if HAS_BIAS:
        b = tl.load(bias_ptr + g, mask=gin, other=0.0)
    else:
        b = 0.0
    return u, b


@triton.jit
def router_stage_tile(h, u, b, g, gin, r, out_row_ptr, HAS_UP: tl.constexpr, HAS_BIAS: tl.constexpr,
                      DECIDE: tl.constexpr):
    """The groups ``g``'s margins from the first GEMV ``h [BLOCK_R]`` (fp32, normalised) and their operands
    (`router_stage_operands`): the second GEMV over the rank (or ``h`` itself when the first stage has the G
    outputs), the bias, and the decisions ``margin >= 0`` (``DECIDE``, uint8) or the fp32 margins, stored."""
    if HAS_UP:
        m = tl.sum(u.to(tl.float32) * h[None, :], axis=1)
    else:  # the first stage already has G outputs (R == G)
        m = tl.sum(tl.where(g[:, None] == r[None, :], h[None, :], 0.0), axis=1)
    if HAS_BIAS:
        m += b.to(tl.float32)
    if DECIDE:
        tl.store(out_row_ptr + g, (m >= 0).to(tl.uint8), mask=gin)
    else:
        tl.store(out_row_ptr + g, m, mask=gin)


@triton.jit
def router_second_stage(h, r, rin, up_ptr, sug, bias_ptr, out_row_ptr, G, HAS_UP: tl.constexpr,
                        HAS_BIAS: tl.constexpr, DECIDE: tl.constexpr, BLOCK_G: tl.constexpr):
    """A linear / low-rank router's rest for one row, BLOCK_G groups a trip: `router_stage_operands`, then
    `router_stage_tile`, to ``out_row_ptr``'s G entries."""
    for g0 in range(0, G, BLOCK_G):
        g = g0 + tl.arange(0, BLOCK_G)
        gin = g < G
        u, b = router_stage_operands(up_ptr, sug, bias_ptr, g, gin, r, rin, HAS_UP, HAS_BIAS)
        router_stage_tile(h, u, b, g, gin, r, out_row_ptr, HAS_UP, HAS_BIAS, DECIDE)


@triton.jit
def _router_margin_kernel(x_ptr, down_ptr, up_ptr, bias_ptr, out_ptr, part_ptr, cnt_ptr, D, R, G, CHUNK,
                          sxm, sdr, sug, som, eps,
                          ema_ptr, sel_ptr, step_ptr, order_ptr, n_ptr, M, weight, keep, refresh_every, scale64,
                          gamma_ptr, y_ptr, sym, norm_eps, NORMALIZE: tl.constexpr, HAS_UP: tl.constexpr,
                          HAS_BIAS: tl.constexpr, DECIDE: tl.constexpr, SPLIT: tl.constexpr,
                          BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_G: tl.constexpr,
                          COHERENT: tl.constexpr, ADAPTIVE: tl.constexpr, LIST: tl.constexpr,
                          BLOCK_GC: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_B: tl.constexpr,
                          WRITE_NORM: tl.constexpr, PREFETCH: tl.constexpr):
    # program (row, s): the first GEMV over columns [s * CHUNK, (s + 1) * CHUNK) of x and ``down``, so that
    # SPLIT programs per row stream the router's weights at once; each writes its partial sums, and the
    # row's last program to finish (an atomic counter) adds them in split order (deterministic), then
    # does the norm, the second GEMV, the bias and the comparison. It resets the counter for the next call.
    # COHERENT: the margins' rows then meet at one more counter (slot M), and the last row's program runs
    # batch-coherent decode's selection over all of them (`coherent_step`): routing a decode step in one launch.
    # WRITE_NORM: the last program also writes the row's HF RMSNorm ``y`` (`rms_norm_route`), from the same sum of
    # squares: the layer's norm and its router in one launch.
    row = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    r = tl.arange(0, BLOCK_R)
    rin = r < R
    h = tl.zeros([BLOCK_R], dtype=tl.float32)
    ss = tl.zeros([BLOCK_D], dtype=tl.float32)
    lo = s * CHUNK
    for d0 in range(lo, tl.minimum(lo + CHUNK, D), BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        din = d < D
        xv = tl.load(x_ptr + row * sxm + d, mask=din, other=0.0).to(tl.float32)
        ss += xv * xv
        w = tl.load(down_ptr + r[:, None] * sdr + d[None, :], mask=rin[:, None] & din[None, :], other=0.0)
        h += tl.sum(w.to(tl.float32) * xv[None, :], axis=1)
    sq = tl.sum(ss, axis=0)
    if PREFETCH:
        # the second stage's operands (every group in one tile, G <= BLOCK_G), loaded by every program before the
        # arrival atomic: whichever program turns out last has them in registers and runs the second GEMV with no
        # memory round trip of its own (the atomic's release keeps the loads above it); the same tile function as
        # `router_second_stage`'s, so the same margins up to the compiler's reduction order (bit for bit in the
        # interpreter; the last bits differed on an H100, 2026-12-07)
        gp = tl.arange(0, BLOCK_G)
        gpin = gp < G
        u_pre, b_pre = router_stage_operands(up_ptr, sug, bias_ptr, gp, gpin, r, rin, HAS_UP, HAS_BIAS)
    if SPLIT > 1:
        base = part_ptr + (row * SPLIT + s) * (BLOCK_R + 1)
        tl.store(base + r, h)
        tl.store(base + BLOCK_R, sq)
        tl.debug_barrier()  # every thread's stores before the one thread's releasing atomic
        done = tl.atomic_add(cnt_ptr + row, 1, sem="acq_rel")  # releases the partials, acquires the others'
        last = done == SPLIT - 1
    else:
        last = True
    if last:
        if SPLIT > 1:
            sp = tl.arange(0, SPLIT)
            rows = part_ptr + (row * SPLIT + sp[:, None]) * (BLOCK_R + 1)
            h = tl.sum(tl.load(rows + r[None, :], cache_modifier=".cg"), axis=0)
            sq = tl.sum(tl.load(part_ptr + (row * SPLIT + sp) * (BLOCK_R + 1) + BLOCK_R, cache_modifier=".cg"), axis=0)
            tl.store(cnt_ptr + row, 0)
        if WRITE_NORM:
            rms_norm_row(x_ptr + row * sxm, gamma_ptr, y_ptr + row * sym, D, tl.rsqrt(sq / D + norm_eps), BLOCK_D,
                         False)
        if NORMALIZE:  # rms(x) @ W^T == (x @ W^T) / rms(x)
            h = h * tl.rsqrt(sq / D + eps)
        if PREFETCH:
            router_stage_tile(h, u_pre, b_pre, gp, gpin, r, out_ptr + row * som, HAS_UP, HAS_BIAS, DECIDE)
        else:
            router_second_stage(h, r, rin, up_ptr, sug, bias_ptr, out_ptr + row * som, G, HAS_UP, HAS_BIAS, DECIDE,
                                BLOCK_G)
        if COHERENT:
            tl.debug_barrier()
            rows_done = tl.atomic_add(cnt_ptr + M, 1, sem="acq_rel")  # releases this row's margins
            if rows_done == M - 1:
                tl.store(cnt_ptr + M, 0)
                coherent_step(out_ptr, ema_ptr, sel_ptr, step_ptr, order_ptr, n_ptr, M, G, som, weight, keep,
                               refresh_every, scale64, ADAPTIVE, LIST, BLOCK_GC, BLOCK_J, BLOCK_B, True)


# rows up to which the router kernels run (decode batches: each row's first GEMV spread over up to 64 programs);
# longer inputs (a prefill) take cuBLAS for the first GEMM and `router_tail` for the rest
# (`_router_margin_rows`)
KERNEL_MAX_ROWS = 64


@triton.jit
def _router_tail_kernel(x_ptr, h_ptr, up_ptr, bias_ptr, out_ptr, M, D, R, G, sxm, shm, sug, som, eps,
                        NORMALIZE: tl.constexpr, SPLIT: tl.constexpr, HAS_UP: tl.constexpr, HAS_BIAS: tl.constexpr,
                        DECIDE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr,
                        BLOCK_G: tl.constexpr):
    # a prefill router's work after its first GEMM (``h = x @ down^T``, fp32, from cuBLAS; SPLIT: the hi and lo
    # halves of fp32 weights side by side, [M, 2R]), BLOCK_M rows a program: the rows' RMS scale from one pass over
    # x, the scaled h, the second GEMM over the rank in fp32 (or the bias alone: a linear router), the comparison
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rowin = rows < M
    rows64 = rows.to(tl.int64)
    r = tl.arange(0, BLOCK_R)
    rin = r < R
    hmask = rowin[:, None] & rin[None, :]
    h = tl.load(h_ptr + rows64[:, None] * shm + r[None, :], mask=hmask, other=0.0)
    if SPLIT:
        h += tl.load(h_ptr + rows64[:, None] * shm + R + r[None, :], mask=hmask, other=0.0)
    if NORMALIZE:  # rms(x) @ W^T == (x @ W^T) / rms(x)
        ss = tl.zeros([BLOCK_M], dtype=tl.float32)
        for d0 in range(0, D, BLOCK_D):
            d = d0 + tl.arange(0, BLOCK_D)
            xv = tl.load(x_ptr + rows64[:, None] * sxm + d[None, :], mask=rowin[:, None] & (d < D)[None, :],
                         other=0.0).to(tl.float32)
            ss += tl.sum(xv * xv, axis=1)
        h = h * tl.rsqrt(ss / D + eps)[:, None]
    if HAS_UP:
        for g0 in range(0, G, BLOCK_G):
            g = g0 + tl.arange(0, BLOCK_G)
            gin = g < G
            u = tl.load(up_ptr + g[:, None] * sug + r[None, :], mask=gin[:, None] & rin[None, :], other=0.0)
            m = tl.sum(h[:, None, :] * u.to(tl.float32)[None, :, :], axis=2)
            if HAS_BIAS:
                m += tl.load(bias_ptr + g, mask=gin, other=0.0).to(tl.float32)[None, :]
            ok = rowin[:, None] & gin[None, :]
            if DECIDE:
                tl.store(out_ptr + rows64[:, None] * som + g[None, :], (m >= 0).to(tl.uint8), mask=ok)
            else:
                tl.store(out_ptr + rows64[:, None] * som + g[None, :], m, mask=ok)
    else:  # the first GEMM's outputs are the groups (R == G)
        if HAS_BIAS:
            h += tl.load(bias_ptr + r, mask=rin, other=0.0).to(tl.float32)[None, :]
        if DECIDE:
            tl.store(out_ptr + rows64[:, None] * som + r[None, :], (h >= 0).to(tl.uint8), mask=hmask)
        else:
            tl.store(out_ptr + rows64[:, None] * som + r[None, :], h, mask=hmask)


def router_tail(x: torch.Tensor, h: torch.Tensor, split: bool, up: torch.Tensor | None, bias: torch.Tensor | None,
                normalize: bool, eps: float, decide: bool) -> torch.Tensor:
    """``x [M, D]`` and its first-GEMM output ``h`` (fp32 ``[M, R]``, or ``[M, 2R]`` hi / lo halves when ``split``)
    -> bool decisions or fp32 margins ``[M, G]``, as `router_margin` (one launch)."""
    M, D = x.shape
    R = h.shape[1] // 2 if split else h.shape[1]
    G = up.shape[0] if up is not None else R
    out = torch.empty(M, G, device=x.device, dtype=torch.bool if decide else torch.float32)
    if M == 0 or G == 0:
        return out
    block_r = max(16, triton.next_power_of_2(R))
    if up is not None:
        block_m = 8 if block_r <= 32 else 4
        block_g = max(16, min(triton.next_power_of_2(G), 4096 // (block_m * block_r)))
    else:
        block_m = max(1, min(8, 4096 // block_r))
        block_g = 16
    block_d = max(16, min(triton.next_power_of_2(D), 4096 // block_m))
    _router_tail_kernel[(triton.cdiv(M, block_m),)](
        x, h, up if up is not None else h, bias if bias is not None else h, out.view(torch.uint8) if decide else out,
        M, D, R, G, x.stride(0), h.stride(0), up.stride(0) if up is not None else 0, G, float(eps),
        NORMALIZE=bool(normalize), SPLIT=bool(split), HAS_UP=up is not None, HAS_BIAS=bias is not None,
        DECIDE=bool(decide), BLOCK_M=block_m, BLOCK_D=block_d, BLOCK_R=block_r, BLOCK_G=block_g, num_warps=4)
    return out


def _margin_launch(x, down, up, bias, normalize: bool, eps: float, dst: torch.Tensor, decide: bool,
                   coherent: dict | None = None, norm: tuple | None = None) -> None:
    """``norm``: ``(weight [D], y [M, D], norm_eps)``, the layer's RMSNorm the last programs also write (per-token
    routing only: not with ``coherent``)."""
    if norm is not None and coherent is not None:
        raise ValueError("router kernel: the fused norm is for per-token routing, not with coherent selection")
    M, D = x.shape
    R = down.shape[0]
    G = dst.shape[1]
    block_r = max(16, triton.next_power_of_2(R))
    block_d = max(16, min(triton.next_power_of_2(D), 4096 // block_r))
    block_g = max(16, min(triton.next_power_of_2(G), 4096 // block_r))
    # one BLOCK_D chunk per program where D allows (up to 64 per row), whatever the row count: the loop over
    # chunks waits on memory once per trip (H200: 4.5 us at one row with one trip; 9.2 us at 16 rows when the
    # split was capped at ~128 programs in all, four trips, 5.3 us uncapped).
    # SPLIT stays a power of two (the finishing program loads all partials as one block), trimmed to the
    # programs that cover D
    n_blocks = triton.cdiv(D, block_d)
    split = min(triton.next_power_of_2(n_blocks), 64)
    chunk = triton.cdiv(n_blocks, split) * block_d
    split = triton.next_power_of_2(triton.cdiv(D, chunk))
    # KernelOptions.router_prefetch: a split row's second stage (`up` and the bias) as one tile of every group (up
    # to 8192 elements), which every program of the row loads before its arrival atomic (`_router_margin_kernel`)
    prefetch = (split > 1 and kernel_options().router_prefetch
                and max(16, triton.next_power_of_2(G)) * block_r <= 8192)
    if prefetch:
        block_g = max(16, triton.next_power_of_2(G))
    parts = torch.empty(M * split * (block_r + 1), device=x.device, dtype=torch.float32) if split > 1 else dst
    c = coherent or {}
    step = c.get("step", dst)  # never read without COHERENT
    order, n = c.get("groups") or (step, step)
    bg, bj, bb = coherent_blocks(M, G) if coherent else (16, 16, 2)
    _router_margin_kernel[(M, split)](
        x, down, up if up is not None else down, bias if bias is not None else down, dst, parts,
        arrival_counters(x.device, M + 1), D, R, G, chunk,
        x.stride(0), down.stride(0), up.stride(0) if up is not None else 0, dst.stride(0), float(eps),
        c.get("ema", dst), c["selection"].view(torch.uint8) if coherent else dst, step, order, n, M,
        1.0 - float(c.get("memory", 0.0)), int(c["keep"]) if c.get("keep") is not None else 0,
        int(c.get("refresh_every", 1)), round(c.get("keep_scale", 1.0) * 64),
        norm[0] if norm else dst, norm[1] if norm else dst, norm[1].stride(0) if norm else 0,
        float(norm[2]) if norm else 0.0,
        NORMALIZE=bool(normalize), HAS_UP=up is not None, HAS_BIAS=bias is not None, DECIDE=bool(decide),
        SPLIT=split, BLOCK_D=block_d, BLOCK_R=block_r, BLOCK_G=block_g,
        COHERENT=coherent is not None, ADAPTIVE=coherent is not None and c.get("keep") is None,
        LIST=c.get("groups") is not None, BLOCK_GC=bg, BLOCK_J=bj, BLOCK_B=bb, WRITE_NORM=norm is not None,
        PREFETCH=prefetch, num_warps=4)


def router_margin(x: torch.Tensor, down: torch.Tensor, up: torch.Tensor | None, bias: torch.Tensor | None,
                  normalize: bool, eps: float, decide: bool) -> torch.Tensor:
    """``x [..., D]`` -> bool ``[..., G]`` decisions (``decide``) or fp32 margins; see `wide.kernels.router_margin`.
    Decode-sized calls (up to `KERNEL_MAX_ROWS` rows) take the one-launch kernel, longer ones cuBLAS + the tail."""
    x2 = x.reshape(-1, x.shape[-1])
    if x2.shape[0] > KERNEL_MAX_ROWS:
        out = _router_margin_rows(x2, down, up, bias, normalize, eps, decide)
    else:
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        out = router_margin_decode(x2, down, up, bias, normalize, eps, decide)
    return out.view(*x.shape[:-1], out.shape[-1])


_MM_FP32_OUT: dict = {}  # device type -> whether torch.mm takes out_dtype=float32 for 16-bit operands there


def _mm_fp32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b^T`` of 16-bit operands with fp32 accumulation *and* fp32 output (cuBLAS), else through fp32."""
    kind = a.device.type
    if _MM_FP32_OUT.get(kind, kind == "cuda"):
        try:
            out = torch.mm(a, b.t(), out_dtype=torch.float32)
            _MM_FP32_OUT[kind] = True
            return out
        except (RuntimeError, TypeError, NotImplementedError):
            _MM_FP32_OUT[kind] = False
    return torch.mm(a.float(), b.float().t())


_HALVES: dict = {}  # id(fp32 router weight) -> (weakref to it, its version, dtype, hi|lo); dropped with the weight


def _halves(w: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[2R, D]``: fp32 weights ``w`` as two ``dtype`` halves, hi = w rounded, lo = the rest rounded (~16
    mantissa bits together). Kept per weight tensor while its version is unchanged (eval weights do not change;
    a captured CUDA graph reuses the halves its warm-up made)."""
    key = id(w)
    hit = _HALVES.get(key)
    if hit is not None and hit[0]() is w and hit[1] == w._version and hit[2] == dtype:
        return hit[3]
    hi = w.detach().to(dtype)
    both = torch.cat([hi, (w.detach() - hi.float()).to(dtype)])
    if capturing(w):  # made inside a graph capture, the halves only exist once it replays: not for eager calls
        return both
    if hit is None or hit[0]() is not w:
        weakref.finalize(w, _HALVES.pop, key, None)
    _HALVES[key] = (weakref.ref(w), w._version, dtype, both)
    return both


def _router_margin_rows(x, down, up, bias, normalize: bool, eps: float, decide: bool) -> torch.Tensor:
    """A prefill's rows: the router's first GEMM on cuBLAS over the raw 16-bit rows (fp32 output), then
    `router_tail` in one launch: the RMS scale (rms(x) @ W^T == (x @ W^T) / rms(x)) from one pass over x, the
    small second GEMM in fp32, the comparison. fp32 router weights (how `apply_wide` keeps them) enter the GEMM as
    two 16-bit halves (``_halves``; the rows are exact in 16 bits), so the margins keep ~fp32 accuracy without an
    fp32 copy of x. The reference's route (an fp32 copy of x, the norm, a cast, fp32 GEMMs) cost 150 us a call at
    4096 x 4096 on the H200; this one's composed torch form (16 launches) 45-54 us."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    split = x.dtype in (torch.float16, torch.bfloat16) and down.dtype == torch.float32
    if split:
        h = _mm_fp32(x, _halves(down, x.dtype))
    elif x.dtype in (torch.float16, torch.bfloat16):
        h = _mm_fp32(x, down.to(x.dtype))
    else:
        h = torch.nn.functional.linear(x, down.to(x.dtype)).float()
    return router_tail(x, h, split, up, bias, normalize, eps, decide)


def router_margin_decode(x: torch.Tensor, down: torch.Tensor, up: torch.Tensor | None, bias: torch.Tensor | None,
                         normalize: bool, eps: float, decide: bool) -> torch.Tensor:
    """``x [M, D]`` (``M <= KERNEL_MAX_ROWS``) -> bool ``[M, G]`` decisions (``decide``) or fp32 margins, one launch."""
    M, D = x.shape
    G = up.shape[0] if up is not None else down.shape[0]
    out = torch.empty(M, G, device=x.device, dtype=torch.bool if decide else torch.float32)
    if M == 0 or G == 0:
        return out
    if M > KERNEL_MAX_ROWS:
        raise ValueError(f"router_margin: the kernel takes up to 64 rows, got {M}")
    _margin_launch(x, down, up, bias, normalize, eps, out.view(torch.uint8) if decide else out, decide)
    return out


def rms_norm_route(x: torch.Tensor, norm_weight: torch.Tensor, norm_eps: float, down: torch.Tensor,
                   up: torch.Tensor | None, bias: torch.Tensor | None, normalize: bool,
                   eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [..., D]`` -> (the HF RMSNorm ``y [..., D]``, bool decisions ``[..., G]``); see
    `wide.kernels.rms_norm_route`. Decode-sized calls (up to `KERNEL_MAX_ROWS` rows) take one launch (the router
    kernel's last program per row writes ``y``), longer ones the torch norm and `router_margin`."""
    from ..backends.torch_ref import hf_rms_norm

    D = x.shape[-1]
    x2 = x.reshape(-1, D)
    G = up.shape[0] if up is not None else down.shape[0]
    if x2.shape[0] > KERNEL_MAX_ROWS or x2.shape[0] == 0 or G == 0:
        return hf_rms_norm(x, norm_weight, norm_eps), router_margin(x, down, up, bias, normalize, eps, True)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = torch.empty(x2.shape, device=x.device, dtype=x.dtype)
    out = torch.empty(x2.shape[0], G, device=x.device, dtype=torch.bool)
    _margin_launch(x2, down, up, bias, normalize, eps, out.view(torch.uint8), True,
                   norm=(norm_weight, y, norm_eps))
    return y.view(x.shape), out.view(*x.shape[:-1], G)


def coherent_route(x: torch.Tensor, down: torch.Tensor, up: torch.Tensor | None, bias: torch.Tensor | None,
                   normalize: bool, eps: float, ema: torch.Tensor, selection: torch.Tensor, step: torch.Tensor,
                   keep: int | None, memory: float, refresh_every: int, keep_scale: float = 1.0,
                   groups: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """`router_margin` then `coherent_select` in one launch; see `wide.kernels.coherent_route` (``x [B, 1, D]`` or
    ``[B, D]``)."""
    x = x.reshape(x.shape[0], x.shape[-1])
    if x.stride(-1) != 1:
        x = x.contiguous()
    M, D = x.shape
    G = up.shape[0] if up is not None else down.shape[0]
    if M > KERNEL_MAX_ROWS:
        raise ValueError(f"coherent_route: the kernel takes up to 64 rows, got {M}")
    margin = torch.empty(M, G, device=x.device, dtype=torch.float32)
    if G:
        _margin_launch(x, down, up, bias, normalize, eps, margin, False,
                       dict(ema=ema, selection=selection, step=step, groups=groups, keep=keep, memory=memory,
                            refresh_every=refresh_every, keep_scale=keep_scale))
    elif groups is not None:
        groups[1].zero_()
    return selection
