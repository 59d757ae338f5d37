"""The routed FFN run as experts (`ffn_experts`): wide FFN groups as the experts of an MoE layer.

With narrow groups (128 channels) and per-token masks, every (128-token tile, group) block of ``down_proj``'s
reduction is needed by some token, so the per-tile path cannot skip any of it (prefill at 50% tops out near
1.44x end to end). Wide groups (>= `EXPERT_MIN_GROUP` channels: an 8B FFN of 14336 has 14 groups of 1024) are
instead run the way MoE layers run: each group's tokens (the routing plan's partition) are gathered into one
grouped layout ``[pairs, ...]`` (group 0's tokens, then group 1's, ...), and

1. ``gate`` / ``up``: grouped GEMMs ``x[tokens_g] @ W[rows_g]^T`` -> ``h [pairs, group]`` with SwiGLU on top;
2. ``down``: a grouped GEMM ``h_g @ W_down[:, cols_g]^T`` -> per-(token, group) partial rows ``[pairs, N]``;
3. a fixed-order combine ``out[t] = sum over g running t, in group order, of partial[slot(t, g)]`` in fp32:
   the same bits on every run (no atomics), `wide.kernels.triton.experts`' kernel or `combine_reference`.

This module holds the layout (`expert_layout`: on the device, from the mask alone; the grouped GEMMs read their
offsets there, so nothing is read on the host and the buffers hold ``M * G`` rows, of which only the pairs' are
ever touched), the grouped GEMMs
(``torch._grouped_mm`` where it runs: CUDA bf16 on sm_90+; elsewhere a loop over the groups, which reads the
counts on the host) and the path choice (`ffn_path`). It imports no Triton.

The same execution serves a reduction-width GEMM alone (`gemm_k`, ``o_proj`` over attention groups of whole KV-head
units, `KernelOptions.gemm_k_experts`): each pair's row is the token's group columns (`gather_cols_reference`),
one grouped GEMM against the weight's column groups gives the partial rows (`reduce_gemm`), the same combine sums
them (`gemm_k_path` picks it).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from .plan import RoutingPlan

# groups at least this wide run as experts (prefill); narrower ones keep the per-tile swiglu + gemm_k path.
# H200 2026-12-02 (benchmarks/experts.py, 8B FFN, 50%, per call with plan / layout): groups of 512 lose to the
# per-tile path (1.31x vs 1.35x at M=4096, 1.38x vs 1.41x at 16384); 1024 tie at 4096 (1.49x vs 1.47x) and win at
# 16384 (1.65x vs 1.44x); 2048 win (1.65x vs 1.40x at 4096)
EXPERT_MIN_GROUP = 1024
# prefill-sized calls only: below this M the per-group GEMMs get skinny and the per-tile / decode kernels fit.
# Measured at M=4096 (H200, outside the project: grouped down 1.36/1.59/1.93x and gate+up 1.76/1.83/2.21x
# faster than dense at groups of 512/1024/2048, 50%); 2048 is a guess between that and decode, to be swept
# (benchmarks/kernel_table.py --ops ffn_experts)
EXPERT_MIN_M = 2048
# the grouped GEMMs' work scales with the density: from ~1.6x at 50% they break even near 0.8 before the
# gather and the combine; above this density the per-tile path (whose gemm_k is premask + cuBLAS) runs
EXPERT_MAX_DENSITY = 0.7
# a routed reduction-width GEMM alone (`gemm_k`: ``o_proj`` over whole KV-head units, 4 heads of 128 = 512 channels
# in an 8B layer, 8 groups) may run as experts from this group width (`KernelOptions.gemm_k_experts`): with
# per-token masks the per-tile path skips no (tile, group) block of the reduction, so at 50% it runs at dense speed;
# as experts it does half the MMAs, but writes and re-reads one partial row per (token, group) pair
K_EXPERT_MIN_GROUP = 512


@dataclasses.dataclass(frozen=True)
class ExpertLayout:
    """The grouped layout of one routing mask (all int32 on the mask's device).

    Attributes:
        ends: ``[G]`` cumulative row ends of the groups (``torch._grouped_mm``'s ``offs``); ``ends[-1]`` is the
            pair count, which the kernels that walk rows read on the device and stop at.
        rows: ``[R]`` the token of each grouped row; rows past ``ends[-1]`` hold anything (never read).
        slot: ``[M, G]`` the grouped row of (token, group), ``-1`` where the token skips the group.
        capacity: ``R``: the pair count when it was read (eager), else ``M * G`` (no host read).
        counts: the per-group counts on the host when they were read (eager), else ``None``.
    """

    ends: torch.Tensor
    rows: torch.Tensor
    slot: torch.Tensor
    capacity: int
    counts: tuple[int, ...] | None


def layout_reference(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The layout in torch (the Triton kernel's twin, `wide.kernels.triton.experts.build_layout`): ``mask [M, G]``
    bool -> ``(ends [G], rows [M * G], slot [M, G])`` int32, group ``g``'s tokens ascending at rows
    ``ends[g - 1] .. ends[g]``; rows past ``ends[-1]`` hold token 0. No host read."""
    M, G = mask.shape
    a = mask.to(torch.int32)
    counts = a.sum(0, dtype=torch.int32)
    ends = torch.cumsum(counts, 0, dtype=torch.int32)
    rank = torch.cumsum(a, 0, dtype=torch.int32) - 1  # a token's rank among its group's tokens
    slot = torch.where(mask, (ends - counts) + rank, torch.full_like(rank, -1))
    # every pair scatters its token to its row; the skipped ones to one spare row past the end, dropped after
    rows = torch.zeros(M * G + 1, device=mask.device, dtype=torch.int32)
    tok = torch.arange(M, device=mask.device, dtype=torch.int32).view(M, 1).expand(M, G).reshape(-1)
    rows.scatter_(0, torch.where(mask, slot, M * G).reshape(-1).long(), tok)
    return ends, rows[:M * G], slot.contiguous()


def expert_layout(plan: RoutingPlan, read_counts: bool, build=None) -> ExpertLayout:
    """The grouped layout of ``plan``'s mask (flattened to ``[M, G]``), cached on the plan.

    Args:
        plan: the mask's plan (the layout needs only its mask, not its partition).
        read_counts: read the per-group counts on the host (the loop over the groups needs them; one
            synchronization), so ``rows`` holds exactly the pairs; ``False`` (the grouped GEMMs, which read their
            offsets on the device: no synchronization, CUDA-graph safe) keeps ``M * G`` rows of buffer, of which
            the kernels touch only the pairs' (every kernel that walks rows stops at the device-side ``ends[-1]``;
            the rest is reserved memory, never read or written).
        build: ``mask [M, G] -> (ends, rows [M * G], slot)`` (the triton backend's one-launch kernel); ``None``:
            `layout_reference`.
    """
    key = f"experts{int(read_counts)}"
    cached = plan.memo(key)
    if cached is not None:
        return cached
    mask = plan.mask.reshape(-1, plan.n_groups)
    M, G = mask.shape
    ends, rows, slot = (build or layout_reference)(mask)
    capacity, host = M * G, None
    if read_counts:
        e = ends.tolist()
        host = tuple(b - a for a, b in zip([0] + e[:-1], e))
        capacity = e[-1] if e else 0
        rows = rows[:capacity]
    layout = ExpertLayout(ends, rows, slot, capacity, host)
    plan.memo(key, layout)
    return layout


def grouped_mm_runs(x: torch.Tensor, *dims: int) -> tuple[bool, str]:
    """Whether ``torch._grouped_mm`` runs these operands (CUTLASS on CUDA sm_90+, bf16, 16-byte aligned rows)."""
    if not hasattr(torch, "_grouped_mm"):
        return False, f"torch {torch.__version__} has no _grouped_mm"
    if not x.is_cuda:
        return False, "not on CUDA"
    if x.dtype != torch.bfloat16:
        return False, f"{x.dtype} (the CUTLASS grouped GEMM takes bf16)"
    if torch.cuda.get_device_capability(x.device) < (9, 0):
        return False, "needs sm_90 or newer"
    if any(d % 8 for d in dims):
        return False, f"sizes {dims} are not multiples of 8 (16-byte rows)"
    return True, ""


def expert_gemms(x2, gate, up, down, layout: ExpertLayout, gmm: str, partial_dtype: torch.dtype,
                 gather=None, swiglu=None) -> torch.Tensor:
    """Steps 1 and 2: the grouped gate/up GEMMs with SwiGLU, then the grouped down GEMM.

    Args:
        x2: ``[M, K]``; gate, up: ``[F, K]``; down: ``[N, F]``.
        layout: `expert_layout` of the mask.
        gmm: ``"grouped"`` (``torch._grouped_mm``, one launch per projection, offsets read on the device) or
            ``"loop"`` (a GEMM per group; needs ``layout.counts``).
        partial_dtype: dtype of the partial rows (x's dtype, or float32: then the loop computes down in fp32).
        gather: ``(x2, layout) -> [R, K]`` the grouped rows of x (default ``index_select`` over all R rows; the
            triton backend copies only the rows before ``ends[-1]``).
        swiglu: ``(g, u, layout) -> h``, in place into ``g`` (default torch's silu and mul over all R rows).

    Returns:
        partial: ``[R, N]``, row ``r`` = ``h[r] @ W_down[:, cols_g]^T`` for the group ``g`` holding row ``r``
        (rows past ``ends[-1]`` are never written).
    """
    F_, K = gate.shape
    N = down.shape[0]
    G = layout.slot.shape[1]
    width = F_ // G
    if _grouped(gmm, partial_dtype, x2):
        xg = gather(x2, layout) if gather is not None else x2.index_select(0, layout.rows)  # [R, K]
        # strided views, no weight copies: [G, K, width] of gate/up, [G, width, N] of down's column groups
        h = torch._grouped_mm(xg, gate.view(G, width, K).transpose(1, 2), offs=layout.ends)
        u = torch._grouped_mm(xg, up.view(G, width, K).transpose(1, 2), offs=layout.ends)
        del xg  # freed before down's output: [R, N] then reuses its [R, K] block (N == K in Llama's FFN)
        h = swiglu(h, u, layout) if swiglu is not None else F.silu(h, inplace=True).mul_(u)
        del u
        return torch._grouped_mm(h, down.view(N, G, width).permute(1, 2, 0), offs=layout.ends)
    return _loop_partials(x2, layout, N, width, partial_dtype,
                          lambda xs, cols: (F.silu(F.linear(xs, gate[cols])) * F.linear(xs, up[cols]), down[:, cols]))


def _grouped(gmm: str, partial_dtype: torch.dtype, x2: torch.Tensor) -> bool:
    """Whether ``gmm`` is the grouped GEMM (``False``: the loop); errors name a bad ``gmm`` or a ``partial_dtype``
    the grouped GEMM cannot write."""
    if gmm == "grouped":
        if partial_dtype != x2.dtype:
            raise ValueError(f"partial_dtype: the grouped GEMM writes {x2.dtype}; {partial_dtype} needs gmm='loop'")
        return True
    if gmm != "loop":
        raise ValueError(f"gmm: 'grouped' or 'loop', got {gmm!r}")
    return False


def _loop_partials(x2: torch.Tensor, layout: ExpertLayout, n_out: int, width: int, partial_dtype: torch.dtype,
                   operands) -> torch.Tensor:
    """The grouped GEMMs' fallback, a GEMM per group (reads ``layout.counts``): ``operands(xs, cols) -> (h, w)``
    from the group's token rows ``xs`` of x2 and its channel slice ``cols``; the group's partial rows are
    ``h @ w^T`` in ``partial_dtype`` (``[R, n_out]``, rows past the pairs never written)."""
    if layout.counts is None:
        raise ValueError("gmm='loop' needs the per-group counts on the host (an eager layout)")
    partial = torch.empty(layout.capacity, n_out, device=x2.device, dtype=partial_dtype)
    start = 0
    for g, c in enumerate(layout.counts):
        if c:
            h, w = operands(x2.index_select(0, layout.rows[start:start + c]), slice(g * width, (g + 1) * width))
            if partial_dtype != h.dtype:
                h, w = h.to(partial_dtype), w.to(partial_dtype)
            partial[start:start + c] = F.linear(h, w)
        start += c
    return partial


def combine_reference(partial: torch.Tensor, slot: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """Step 3 in torch (the Triton kernel's twin): ``out[t] = sum_g partial[slot[t, g]]`` over the groups ``t``
    runs, in group order, in fp32. ``partial [R, N]``, ``slot [M, G]`` -> ``[M, N]``."""
    M, G = slot.shape
    acc = torch.zeros(M, partial.shape[1], device=partial.device, dtype=torch.float32)
    for g in range(G):
        s = slot[:, g]
        rows = partial.index_select(0, s.clamp_min(0)).float() if partial.shape[0] else acc
        acc += torch.where((s >= 0)[:, None], rows, 0.0)
    return acc.to(out_dtype)


def ffn_path(M: int, width: int, plan: RoutingPlan, eager: bool, enabled: bool = True,
             min_group: int | None = None) -> str:
    """How a routed FFN call runs: ``"experts"``, ``"tiles"`` (swiglu + gemm_k, the per-tile kernels) or
    ``"dense"`` (cuBLAS, every pair known to run).

    Args:
        M: tokens of the call; width: channels per group.
        plan: the mask's plan: its density hint, or its measured density (one host read, only when ``eager``).
        eager: host reads allowed (not under CUDA-graph capture).
        enabled: the `KernelOptions.ffn_experts` switch (``False``: the per-tile path, as before).
        min_group: the narrowest group that runs as experts (default `EXPERT_MIN_GROUP`; `gemm_k_path` passes
            `K_EXPERT_MIN_GROUP`).
    """
    if not enabled or width < (EXPERT_MIN_GROUP if min_group is None else min_group) or M < EXPERT_MIN_M:
        return "tiles"
    if plan.density_hint is not None:
        return "experts" if plan.density_hint <= EXPERT_MAX_DENSITY else "tiles"
    if not eager:
        return "tiles"  # the density would take a host read
    density = plan.density()
    if density == 1.0:
        return "dense"
    return "experts" if density <= EXPERT_MAX_DENSITY else "tiles"


def gemm_k_path(M: int, width: int, plan: RoutingPlan, eager: bool, enabled: bool) -> str:
    """How a routed reduction-width GEMM (`gemm_k`) runs: ``"experts"`` (`reduce_gemm` + `combine_reference`'s
    fixed-order sum) or ``"tiles"`` (the per-tile kernels, whose premask path runs cuBLAS on an all-true mask).
    Arguments as in `ffn_path`; ``enabled``: `KernelOptions.gemm_k_experts`."""
    path = ffn_path(M, width, plan, eager, enabled, min_group=K_EXPERT_MIN_GROUP)
    return "experts" if path == "experts" else "tiles"


def gather_cols_reference(x2: torch.Tensor, layout: ExpertLayout, width: int) -> torch.Tensor:
    """``[R, width]``: grouped row ``r`` of group ``g`` holds ``x2[rows[r], g * width:(g + 1) * width]`` (the Triton
    kernel's twin, `wide.kernels.triton.experts.gather_cols`); rows past ``ends[-1]`` hold the last group's columns
    of some token (never read)."""
    M, K = x2.shape
    G = layout.slot.shape[1]
    R = layout.rows.shape[0]
    r = torch.arange(R, device=x2.device, dtype=layout.ends.dtype)
    g = torch.bucketize(r, layout.ends, right=True).clamp_max(G - 1)
    t = layout.rows.long().clamp(0, max(M - 1, 0))  # rows past the pairs may hold anything (a Triton layout)
    return x2.reshape(M, G, width)[t, g.long()]


def reduce_gemm(x2: torch.Tensor, weight: torch.Tensor, layout: ExpertLayout, gmm: str, partial_dtype: torch.dtype,
                gather_cols=None) -> torch.Tensor:
    """A reduction-width GEMM ``[M, K] x [N, K]^T`` over ``G`` column groups as experts: ``partial [R, N]``, row
    ``r`` of group ``g`` = ``x2[t, cols_g] @ W[:, cols_g]^T`` for its token ``t``; `combine` sums a token's rows.

    Args:
        x2: ``[M, K]``; weight: ``[N, K]``; layout: `expert_layout` of the ``[M, G]`` mask.
        gmm, partial_dtype: as in `expert_gemms`.
        gather_cols: ``(x2, layout, width) -> [R, width]`` (default `gather_cols_reference`; the triton backend
            copies only the pairs' rows).
    """
    N, K = weight.shape
    G = layout.slot.shape[1]
    width = K // G
    if _grouped(gmm, partial_dtype, x2):
        xg = (gather_cols or gather_cols_reference)(x2, layout, width)  # [R, width]
        # a strided view of the weight's column groups, no copy: [G, width, N]
        return torch._grouped_mm(xg, weight.view(N, G, width).permute(1, 2, 0), offs=layout.ends)
    return _loop_partials(x2, layout, N, width, partial_dtype, lambda xs, cols: (xs[:, cols], weight[:, cols]))


def ffn_dense(x2, gate, up, down, out: torch.Tensor | None = None) -> torch.Tensor:
    """Every (token, group) pair runs: the plain cuBLAS FFN ``silu(x gate^T) * (x up^T) @ down^T`` (into
    ``out [M, N]`` when given)."""
    h = F.silu(F.linear(x2, gate), inplace=True).mul_(F.linear(x2, up))
    return torch.mm(h, down.t(), out=out) if out is not None else F.linear(h, down)
