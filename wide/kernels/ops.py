"""Public routed ops. Each validates shapes, picks a backend per call and runs it.

Tensor conventions (all backends agree; mask True = execute):

| op | inputs | mask | output |
|---|---|---|---|
| gemm_mn | x ``[..., K]``, weight ``[N, K]`` | ``[..., N/G]`` | ``[..., N]``, exact zeros where masked |
| swiglu | x ``[..., K]``, gate/up ``[N, K]`` | ``[..., N/G]`` | ``silu(x gate^T) * (x up^T)``, zeros where masked |
| gemm_k | x ``[..., K]``, weight ``[N, K]`` | ``[..., K/G]`` | ``(x * mask expanded) @ weight^T`` |
| ffn_experts | x ``[..., K]``, gate/up ``[F, K]``, down ``[N, F]`` | ``[..., F/G]`` | ``gemm_k(swiglu(...), down)`` |
| attention_prefill | q ``[B, T, Hq, D]``, k/v ``[B, S, Hk, D]`` | ``[B, T, Hq/g]`` | ``[B, T, Hq, D]`` |
| attention_decode | q ``[B, 1, Hq, D]``, k/v ``[B, S, Hk, D]`` | ``[B, 1, Hq/g]`` | ``[B, 1, Hq, D]`` |
| decode_qkv | x ``[B, 1, K]``, q/k/v weights, cache ``[B, Hk, S, D]`` | ``[B, 1, Hq/g]`` | q ``[B, 1, Hq, D]`` |

The routing ops, which make the masks themselves, are in `wide.kernels.route_ops`.

Under ``torch.compile`` every op here (and `make_plan`) is a graph break that runs eagerly
(``torch.compiler.disable``): the compiler fuses the model's own glue between them (norms, RoPE,
residual adds) and never traces into the dispatch or the Triton launches.
"""

from __future__ import annotations

import torch

from . import dispatch
from .plan import RoutingPlan


def _leading(x: torch.Tensor, mask: torch.Tensor, what: str) -> None:
    if tuple(mask.shape[:-1]) != tuple(x.shape[:-1]):
        raise ValueError(f"{what}: mask {tuple(mask.shape)} must be [*x.shape[:-1], groups] "
                         f"with x {tuple(x.shape)}")


def _divides(total: int, parts: int, what: str) -> None:
    if parts <= 0 or total % parts:
        raise ValueError(f"{what}: {parts} groups do not split {total} evenly")


@torch.compiler.disable
def gemm_mn(x, weight, mask, *, bias=None, activation=None, plan: RoutingPlan | None = None,
            backend: str = "auto", out=None):
    """Output-width routed linear: group ``g`` of output columns is computed only where ``mask`` says.

    Args:
        x: ``[..., K]`` (e.g. ``[B, T, K]`` or ``[M, K]``).
        weight: ``[N, K]``.
        mask: ``[..., N/G]`` bool (or float in {0, 1} on the torch backend, for training).
        bias: ``[N]`` or None.
        activation: None, ``"silu"``, ``"gelu"`` or ``"relu"``, applied before masking.
        plan: routing plan of ``mask`` (`make_plan`), shared with the paired op.
        backend: ``"auto"`` or a registered backend (``"torch"``, ``"gather"``, ``"triton"``, plug-ins).
        out: optional ``[..., N]`` output buffer (every element is written).

    Returns:
        ``[..., N]`` with exact zeros in masked groups.
    """
    _leading(x, mask, "gemm_mn")
    if weight.dim() != 2 or weight.shape[1] != x.shape[-1]:
        raise ValueError(f"gemm_mn: weight {tuple(weight.shape)} must be [N, {x.shape[-1]}]")
    _divides(weight.shape[0], mask.shape[-1], "gemm_mn")
    call = dict(x=x, weight=weight, mask=mask, bias=bias, activation=activation, plan=plan, out=out)
    return dispatch.choose("gemm_mn", backend, call, x.device).gemm_mn(
        x, weight, mask, bias=bias, activation=activation, plan=plan, out=out)


@torch.compiler.disable
def swiglu(x, gate_weight, up_weight=None, mask=None, *, plan: RoutingPlan | None = None,
           backend: str = "auto", out=None):
    """Fused routed SwiGLU: ``silu(x gate^T) * (x up^T)`` under one output-width mask, one pass over x.

    Args:
        x: ``[..., K]``.
        gate_weight: ``[N, K]``, or the concatenated ``[2N, K]`` gate_up weight when ``up_weight`` is
            None (gate rows first).
        up_weight: ``[N, K]`` or None.
        mask: ``[..., N/G]`` bool (float on the torch backend).
        plan, backend, out: as in `gemm_mn`.

    Returns:
        ``[..., N]``, exact zeros in masked groups.
    """
    if mask is None:
        raise TypeError("swiglu: mask is required")
    if up_weight is None:
        if gate_weight.shape[0] % 2:
            raise ValueError(f"swiglu: concatenated gate_up weight {tuple(gate_weight.shape)} has odd rows")
        gate_weight, up_weight = gate_weight.chunk(2, dim=0)
    _leading(x, mask, "swiglu")
    if gate_weight.shape != up_weight.shape or gate_weight.shape[1] != x.shape[-1]:
        raise ValueError(f"swiglu: gate {tuple(gate_weight.shape)} and up {tuple(up_weight.shape)} "
                         f"must both be [N, {x.shape[-1]}]")
    _divides(gate_weight.shape[0], mask.shape[-1], "swiglu")
    call = dict(x=x, gate_weight=gate_weight, up_weight=up_weight, mask=mask, plan=plan, out=out)
    return dispatch.choose("swiglu", backend, call, x.device).swiglu(
        x, gate_weight, up_weight, mask, plan=plan, out=out)


@torch.compiler.disable
def gemm_k(x, weight, mask, *, bias=None, plan: RoutingPlan | None = None, backend: str = "auto",
           out=None, x_masked: bool = False, residual=None):
    """Reduction-width routed linear: ``(x * mask expanded over K groups) @ weight^T (+ bias)``.

    Args:
        x: ``[..., K]``.
        weight: ``[N, K]``.
        mask: ``[..., K/G]`` bool (float on the torch backend).
        bias: ``[N]`` or None.
        plan, backend, out: as in `gemm_mn`.
        x_masked: promise that ``x`` is already zero in masked groups (it is the output of `gemm_mn` /
            `swiglu` under the same mask, e.g. the down projection after gate/up); fast backends may
            then skip applying the mask. Results are the same either way when the promise holds.
        residual: ``[..., N]`` added to the result (a decoder layer's residual stream): backends that take it
            (``takes_residual``) add it to the rounded result in their epilogue (the same bits), the others after.

    Returns:
        ``[..., N]``.
    """
    _leading(x, mask, "gemm_k")
    if weight.dim() != 2 or weight.shape[1] != x.shape[-1]:
        raise ValueError(f"gemm_k: weight {tuple(weight.shape)} must be [N, {x.shape[-1]}]")
    _divides(x.shape[-1], mask.shape[-1], "gemm_k")
    if residual is not None and (tuple(residual.shape) != (*x.shape[:-1], weight.shape[0])
                                 or residual.dtype != x.dtype or residual.device != x.device):
        raise ValueError(f"gemm_k: residual {tuple(residual.shape)} {residual.dtype} must be "
                         f"[{', '.join(map(str, (*x.shape[:-1], weight.shape[0])))}] {x.dtype} on {x.device}")
    call = dict(x=x, weight=weight, mask=mask, bias=bias, plan=plan, out=out)
    impl = dispatch.choose("gemm_k", backend, call, x.device)
    if residual is not None and impl.takes_residual:
        return impl.gemm_k(x, weight, mask, bias=bias, plan=plan, out=out, x_masked=x_masked, residual=residual)
    y = impl.gemm_k(x, weight, mask, bias=bias, plan=plan, out=out, x_masked=x_masked)
    return y if residual is None else y.add_(residual)


@torch.compiler.disable
def ffn_experts(x, gate_weight, up_weight, down_weight, mask, *, plan: RoutingPlan | None = None,
                backend: str = "auto", out=None):
    """Routed SwiGLU FFN in one call: ``gemm_k(swiglu(x, gate, up, mask), down, mask)``.

    Backends pick how: the ``triton`` backend runs wide groups (>= 512 channels) of a prefill-sized call as
    experts (grouped GEMMs over each group's gathered tokens, then a fixed-order deterministic combine of the
    per-(token, group) partial rows; see `wide.kernels.experts`), everything else as the per-tile swiglu +
    gemm_k, and all-true masks as plain cuBLAS.

    Args:
        x: ``[..., K]``.
        gate_weight, up_weight: ``[F, K]``.
        down_weight: ``[N, F]``.
        mask: ``[..., G]`` bool over the ``F / G``-channel groups (float on the torch backend).
        plan, backend, out: as in `gemm_mn` (``out`` is ``[..., N]``).

    Returns:
        ``[..., N]``.
    """
    _leading(x, mask, "ffn_experts")
    K = x.shape[-1]
    if gate_weight.dim() != 2 or gate_weight.shape[1] != K or up_weight.shape != gate_weight.shape:
        raise ValueError(f"ffn_experts: gate {tuple(gate_weight.shape)} and up {tuple(up_weight.shape)} must both "
                         f"be [F, {K}]")
    if down_weight.dim() != 2 or down_weight.shape[1] != gate_weight.shape[0]:
        raise ValueError(f"ffn_experts: down {tuple(down_weight.shape)} must be [N, {gate_weight.shape[0]}]")
    _divides(gate_weight.shape[0], mask.shape[-1], "ffn_experts")
    call = dict(x=x, gate_weight=gate_weight, up_weight=up_weight, down_weight=down_weight, mask=mask, plan=plan,
                out=out)
    return dispatch.choose("ffn_experts", backend, call, x.device).ffn_experts(
        x, gate_weight, up_weight, down_weight, mask, plan=plan, out=out)


def _check_attention(q, k, v, mask, what: str) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"{what}: q, k, v must be 4-d ([B, T, H, D])")
    B, T, HQ, D = q.shape
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"{what}: k {tuple(k.shape)} / v {tuple(v.shape)} must be [{B}, S, Hk, {D}]")
    HK = k.shape[2]
    if HQ % HK:
        raise ValueError(f"{what}: {HQ} query heads are not a multiple of {HK} kv heads")
    if tuple(mask.shape[:2]) != (B, T) or mask.dim() != 3:
        raise ValueError(f"{what}: mask {tuple(mask.shape)} must be [{B}, {T}, groups]")
    _divides(HQ, mask.shape[-1], what)
    g, qpk = HQ // mask.shape[-1], HQ // HK
    if qpk % g and g % qpk:
        raise ValueError(f"{what}: a group of {g} heads splits the {qpk} query heads of a kv head unevenly")


@torch.compiler.disable
def decode_qkv(x, q_weight, k_weight, v_weight, mask, *, q_bias=None, k_bias=None, v_bias=None, cos, sin, k_cache,
               v_cache, position, backend: str = "auto", out=None, eager_rope: bool = False, part: str = "all"):
    """A decode step's routed q projection, dense k / v projections, RoPE and static-cache write, in one call
    (one launch on the triton backend, `wide.kernels.triton.decode_qkv`).

    Args:
        x: ``[B, 1, K]`` the attention norm's output.
        q_weight: ``[Hq * D, K]``; k_weight / v_weight: ``[Hk * D, K]`` (contiguous).
        mask: ``[B, 1, Hq/g]`` bool: the head groups each row runs (q of a skipped group is zero), or ``None``:
            every q head is computed (the attention reads only its rows' groups).
        q_bias, k_bias, v_bias: ``[N]`` each, or all ``None``.
        cos, sin: ``[B or 1, 1, D]`` the rotary embedding of the step's position (HF's ``position_embeddings``).
        k_cache, v_cache: ``[B, Hk, S, D]`` a static cache layer's keys / values: row ``b``'s new key and value go
            to position ``position`` of every head.
        position: a one-element int64 tensor, the cache's write position (transformers' ``StaticLayer``
            ``cumulative_length``); advanced by one, as the cache's own ``update`` does.
        backend, out: as in `gemm_mn` (``out`` is ``[B, 1, Hq, D]``).
        eager_rope: RoPE as eager transformers rounds it in 16-bit (each of ``q * cos`` and ``rotate_half(q) *
            sin`` rounded to ``x``'s dtype, then their sum); default: in fp32, rounded once (as compiled RoPE,
            `wide.fuse_glue`'s inductor graph). A router downstream reads the result: the reference path's rounding
            keeps its near-zero margins on the same side.
        part: ``"all"``; ``"kv"``: only k / v, the cache write and the position bump (returns ``None``; the mask is
            not read: the router may still be deciding); ``"q"``: only q (the cache and ``position`` untouched) —
            the two halves of one call, in that order, for a step that decides its mask beside the k / v launch
            (`KernelOptions.decode_qkv_split`).

    Returns:
        q ``[B, 1, Hq, D]``, rotated, zeros in skipped head groups (``None`` for ``part="kv"``).
    """
    if part not in ("all", "q", "kv"):
        raise ValueError(f"decode_qkv: part must be 'all', 'q' or 'kv', got {part!r}")
    if x.dim() != 3 or x.shape[1] != 1:
        raise ValueError(f"decode_qkv: x {tuple(x.shape)} must be [B, 1, K] (one decode step)")
    B, _, K = x.shape
    if k_cache.dim() != 4 or v_cache.shape != k_cache.shape or k_cache.shape[0] != B:
        raise ValueError(f"decode_qkv: k_cache {tuple(k_cache.shape)} / v_cache {tuple(v_cache.shape)} must both "
                         f"be [{B}, Hk, S, D]")
    D, HK = k_cache.shape[3], k_cache.shape[1]
    if D % 2 or q_weight.dim() != 2 or q_weight.shape[1] != K or q_weight.shape[0] % D:
        raise ValueError(f"decode_qkv: q_weight {tuple(q_weight.shape)} must be [Hq * {D}, {K}] (head dim even)")
    for name, w in (("k_weight", k_weight), ("v_weight", v_weight)):
        if tuple(w.shape) != (HK * D, K):
            raise ValueError(f"decode_qkv: {name} {tuple(w.shape)} must be [{HK * D}, {K}]")
    biases = (q_bias, k_bias, v_bias)
    if any(b is None for b in biases) and any(b is not None for b in biases):
        raise ValueError("decode_qkv: q_bias, k_bias and v_bias are given together or not at all")
    HQ = q_weight.shape[0] // D
    if mask is not None:
        if mask.dim() != 3 or tuple(mask.shape[:2]) != (B, 1):
            raise ValueError(f"decode_qkv: mask {tuple(mask.shape)} must be [{B}, 1, groups]")
        _divides(HQ, mask.shape[-1], "decode_qkv")
    for name, t in (("cos", cos), ("sin", sin)):
        if t.shape[-1] != D or t.numel() not in (D, B * D):
            raise ValueError(f"decode_qkv: {name} {tuple(t.shape)} must be [{B} or 1, 1, {D}]")
    if position.numel() != 1 or position.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"decode_qkv: position must be a one-element integer tensor, got {tuple(position.shape)} "
                         f"{position.dtype}")
    call = dict(x=x, q_weight=q_weight, k_weight=k_weight, v_weight=v_weight, mask=mask, q_bias=q_bias,
                k_bias=k_bias, v_bias=v_bias, cos=cos, sin=sin, k_cache=k_cache, v_cache=v_cache,
                position=position, out=out)
    return dispatch.choose("decode_qkv", backend, call, x.device).decode_qkv(
        x, q_weight, k_weight, v_weight, mask, q_bias=q_bias, k_bias=k_bias, v_bias=v_bias, cos=cos, sin=sin,
        k_cache=k_cache, v_cache=v_cache, position=position, out=out, **({"eager_rope": True} if eager_rope else {}),
        **({"part": part} if part != "all" else {}))


@torch.compiler.disable
def attention_prefill(q, k, v, mask, *, causal: bool = True, scale: float | None = None, lengths=None,
                      q_offset=None, plan: RoutingPlan | None = None, backend: str = "auto", out=None):
    """Routed prefill attention over (query token x head group).

    Args:
        q: ``[B, T, Hq, D]``.
        k, v: ``[B, S, Hk, D]``, strided views allowed (an HF cache ``[B, Hk, S, D]``.transpose(1, 2)).
        mask: ``[B, T, Hq/g]`` bool (float on the torch backend).
        causal: query ``i`` sits at key position ``S - T + i`` (or ``q_offset[b] + i``) and sees keys up to it.
        scale: softmax scale, default ``D ** -0.5``.
        lengths: optional ``[B]`` int valid key length per row (keys at or past it are ignored).
        q_offset: optional ``[B]`` int key position of each row's first query, read on the device (a prompt
            chunk over a static cache: ``q_offset = lengths - T``); default ``S - T``.
        plan, backend, out: as in `gemm_mn` (``out`` is ``[B, T, Hq, D]``).

    Returns:
        ``[B, T, Hq, D]``, zeros for inactive (token, group).
    """
    _check_attention(q, k, v, mask, "attention_prefill")
    for name, t in (("lengths", lengths), ("q_offset", q_offset)):
        if t is not None and (not isinstance(t, torch.Tensor) or t.shape != (q.shape[0],) or t.is_floating_point()):
            raise ValueError(f"attention_prefill: {name} must be an int tensor [{q.shape[0]}], got "
                             f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}")
    call = dict(q=q, k=k, v=v, mask=mask, causal=causal, scale=scale, lengths=lengths, q_offset=q_offset, plan=plan,
                out=out)
    return dispatch.choose("attention_prefill", backend, call, q.device).attention_prefill(
        q, k, v, mask, causal=causal, scale=scale, lengths=lengths, q_offset=q_offset, plan=plan, out=out)


@torch.compiler.disable
def attention_decode(q, k, v, mask, *, lengths=None, scale: float | None = None, backend: str = "auto",
                     out=None, density: float | None = None):
    """Routed decode attention: one query per row over a right-padded KV cache.

    Args:
        q: ``[B, 1, Hq, D]``.
        k, v: ``[B, S, Hk, D]`` strided views allowed.
        mask: ``[B, 1, Hq/g]`` bool (float on the torch backend).
        lengths: ``[B]`` int valid KV length per row (default: all ``S``).
        scale, backend, out: as in `attention_prefill`.
        density: the expected share of executing (row, group) pairs, e.g. the router's rate (no host sync);
            the triton backend picks its launch config from it (``None``: tuned for about half).

    Returns:
        ``[B, 1, Hq, D]``, zeros for inactive head groups; no K/V is read for a kv head none of whose
        query heads runs (triton backend).
    """
    _check_attention(q, k, v, mask, "attention_decode")
    if q.shape[1] != 1:
        raise ValueError(f"attention_decode: q must have one query per row, got {tuple(q.shape)}")
    if density is not None and not 0.0 <= density <= 1.0:
        raise ValueError(f"attention_decode: density must be in [0, 1], got {density!r}")
    call = dict(q=q, k=k, v=v, mask=mask, lengths=lengths, scale=scale, out=out)
    impl = dispatch.choose("attention_decode", backend, call, q.device)
    if density is not None and impl.takes_density:
        return impl.attention_decode(q, k, v, mask, lengths=lengths, scale=scale, out=out, density=density)
    return impl.attention_decode(q, k, v, mask, lengths=lengths, scale=scale, out=out)
