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

Two routing ops make the masks themselves (eval mode, one launch each on the triton backend):
`router_margin` (a linear / low-rank router's execute-minus-skip margin or decision) and
`coherent_select` (batch-coherent decode's shared top-k with its EMA memory and refresh schedule), and
`coherent_route`, the two in one launch for a decode step; `rms_norm_route` gives a layer's HF RMSNorm output with
its router's decisions (one launch for both at a decode step).

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
               v_cache, position, backend: str = "auto", out=None, eager_rope: bool = False):
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

    Returns:
        q ``[B, 1, Hq, D]``, rotated, zeros in skipped head groups.
    """
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
        k_cache=k_cache, v_cache=v_cache, position=position, out=out, **({"eager_rope": True} if eager_rope else {}))


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


def _check_router(what: str, x, down, up, bias) -> int:
    """Shapes of a linear / low-rank router over ``x``; returns its group count G."""
    if down.dim() != 2 or down.shape[1] != x.shape[-1]:
        raise ValueError(f"{what}: down {tuple(down.shape)} must be [R, {x.shape[-1]}]")
    if up is not None and (up.dim() != 2 or up.shape[1] != down.shape[0]):
        raise ValueError(f"{what}: up {tuple(up.shape)} must be [G, {down.shape[0]}]")
    g = up.shape[0] if up is not None else down.shape[0]
    if bias is not None and tuple(bias.shape) != (g,):
        raise ValueError(f"{what}: bias {tuple(bias.shape)} must be [{g}]")
    return g


@torch.compiler.disable
def gemm_k_route(x, weight, mask, residual, norm_weight, norm_eps: float, down, up=None, bias=None, *,
                 normalize: bool = True, eps: float = 1e-6, plan: RoutingPlan | None = None, backend: str = "auto",
                 x_masked: bool = False):
    """A decode sub-layer's closing projection, its residual add, and the next norm with its router, in one launch
    on the triton backend (one row): ``h = residual + gemm_k(x, weight, mask)`` is the new residual stream, and
    ``rms_norm_route(h, norm_weight, norm_eps, down, up, bias)`` what the next routed sub-layer reads (its norm's
    output and its router's decisions). The kernel's tiles each add their columns' share of the router's first GEMV
    and of the sum of squares as they write ``h``; the last tile finishes the norm and the decisions.

    Args:
        x, weight, mask, plan, x_masked: as in `gemm_k` (no bias: a decoder's ``o_proj`` / ``down_proj``).
        residual: ``[..., N]`` in ``x``'s dtype, the residual stream the projection adds to.
        norm_weight, norm_eps, down, up, bias, normalize, eps: the next norm and router, as in `rms_norm_route`
            (over ``h``, so ``down`` is ``[R, N]``).
        backend: as in `gemm_mn`. The triton kernel takes one row; other calls (and other backends) run `gemm_k`
            with the residual, then `rms_norm_route`.

    Returns:
        ``(h [..., N], y [..., N] in x.dtype, decisions [..., G] bool)``.
    """
    _leading(x, mask, "gemm_k_route")
    if weight.dim() != 2 or weight.shape[1] != x.shape[-1]:
        raise ValueError(f"gemm_k_route: weight {tuple(weight.shape)} must be [N, {x.shape[-1]}]")
    _divides(x.shape[-1], mask.shape[-1], "gemm_k_route")
    n = weight.shape[0]
    if tuple(residual.shape) != (*x.shape[:-1], n) or residual.dtype != x.dtype or residual.device != x.device:
        raise ValueError(f"gemm_k_route: residual {tuple(residual.shape)} {residual.dtype} must be "
                         f"[{', '.join(map(str, (*x.shape[:-1], n)))}] {x.dtype} on {x.device}")
    _check_router("gemm_k_route", residual, down, up, bias)
    if tuple(norm_weight.shape) != (n,):
        raise ValueError(f"gemm_k_route: norm_weight {tuple(norm_weight.shape)} must be [{n}]")
    call = dict(x=x, weight=weight, mask=mask, residual=residual, norm_weight=norm_weight, down=down, up=up,
                bias=bias, plan=plan)
    return dispatch.choose("gemm_k_route", backend, call, x.device).gemm_k_route(
        x, weight, mask, residual, norm_weight, norm_eps, down, up, bias, normalize=normalize, eps=eps, plan=plan,
        x_masked=x_masked)


@torch.compiler.disable
def router_margin(x, down, up=None, bias=None, *, normalize: bool = True, eps: float = 1e-6,
                  decide: bool = True, backend: str = "auto"):
    """Execute-minus-skip margin of a linear router, or the decision ``margin >= 0``, for every token.

    ``margin = F.linear(F.linear(n(x), down), up, bias)`` (``up`` None: ``F.linear(n(x), down, bias)``),
    with ``n`` the parameter-free RMS norm (``normalize``) computed in fp32 and cast to ``down``'s dtype:
    exactly `wide.routers.LowRankRouter`'s eval path (``up`` = its folded execute-minus-skip rows).

    Args:
        x: ``[..., D]`` residual stream.
        down: ``[R, D]``.
        up: ``[G, R]`` or None (then ``G = R``).
        bias: ``[G]`` or None.
        normalize, eps: RMS-normalise ``x`` first.
        decide: return bool decisions (``margin >= 0``, ties execute) instead of fp32 margins.
        backend: as in `gemm_mn`. The triton kernel takes up to 64 rows (decode steps); longer inputs
            go to cuBLAS through the reference.

    Returns:
        ``[..., G]`` bool (``decide``) or float32.
    """
    _check_router("router_margin", x, down, up, bias)
    call = dict(x=x, down=down, up=up, bias=bias)
    return dispatch.choose("router_margin", backend, call, x.device).router_margin(
        x, down, up, bias, normalize=normalize, eps=eps, decide=decide)


@torch.compiler.disable
def rms_norm_route(x, norm_weight, norm_eps: float, down, up=None, bias=None, *, normalize: bool = True,
                   eps: float = 1e-6, backend: str = "auto"):
    """A layer's RMSNorm and its router's decisions from the same pre-norm residual ``x``, in one launch on the
    triton backend at a decode step (both read ``x`` and its sum of squares).

    ``y = norm_weight * (x32 * rsqrt(mean(x32^2) + norm_eps)).to(x.dtype)`` (HF ``LlamaRMSNorm`` /
    ``Qwen2RMSNorm``; the product in fp32, rounded once to ``x``'s dtype) and ``router_margin(x, down, up, bias,
    normalize=normalize, eps=eps) >= 0``: ``norm_eps`` is the model's ``rms_norm_eps``, ``eps`` the router's own.

    Args:
        x: ``[..., D]`` pre-norm residual stream.
        norm_weight: ``[D]``, the norm's weight.
        norm_eps: the norm's epsilon.
        down, up, bias, normalize, eps: the router, as in `router_margin`.
        backend: as in `gemm_mn`. The triton kernel takes up to 64 rows; longer inputs run the norm in torch and
            `router_margin`.

    Returns:
        ``(y [..., D] in x.dtype, decisions [..., G] bool)``.
    """
    _check_router("rms_norm_route", x, down, up, bias)
    if tuple(norm_weight.shape) != (x.shape[-1],):
        raise ValueError(f"rms_norm_route: norm_weight {tuple(norm_weight.shape)} must be [{x.shape[-1]}]")
    call = dict(x=x, norm_weight=norm_weight, down=down, up=up, bias=bias)
    return dispatch.choose("rms_norm_route", backend, call, x.device).rms_norm_route(
        x, norm_weight, norm_eps, down, up, bias, normalize=normalize, eps=eps)


def _check_coherent(what: str, g: int, ema, selection, step, keep, memory, refresh_every, keep_scale, groups,
                    device) -> None:
    if tuple(ema.shape) != (g,) or ema.dtype != torch.float32:
        raise ValueError(f"{what}: ema must be float32 [{g}], got {ema.dtype} {tuple(ema.shape)}")
    if tuple(selection.shape) != (g,) or selection.dtype != torch.bool:
        raise ValueError(f"{what}: selection must be bool [{g}], got {selection.dtype} {tuple(selection.shape)}")
    if step.dim() != 0 or step.dtype != torch.int64:
        raise ValueError(f"{what}: step must be an int64 scalar tensor, got {step.dtype} {tuple(step.shape)}")
    if keep is not None and not 1 <= keep <= g:
        raise ValueError(f"{what}: keep must be None or in [1, {g}], got {keep}")
    if not 0.0 < keep_scale <= 16.0 or round(keep_scale * 64) < 1:
        raise ValueError(f"{what}: keep_scale must be in (0, 16] (steps of 1/64), got {keep_scale!r}")
    if keep is not None and keep_scale != 1.0:
        raise ValueError(f"{what}: keep_scale scales the adaptive count: pass keep=None with it")
    if not 0.0 <= memory < 1.0 or refresh_every < 1:
        raise ValueError(f"{what}: memory must be in [0, 1) and refresh_every >= 1, got {memory}, {refresh_every}")
    if groups is not None:
        order, n = groups
        if tuple(order.shape) != (g,) or order.dtype != torch.int32 or tuple(n.shape) != (1,) or \
                n.dtype != torch.int32 or order.device != device or n.device != device:
            raise ValueError(f"{what}: groups must be (int32 [{g}], int32 [1]) on {device}")


@torch.compiler.disable
def coherent_select(margin, ema, selection, step, *, keep: int | None, memory: float = 0.0, refresh_every: int = 1,
                    keep_scale: float = 1.0, groups: tuple | None = None, backend: str = "auto"):
    """One decode step of batch-coherent routing, updating its state in place (no host sync).

    ``ema <- lerp(ema, mean_b sigmoid(margin), 1 - memory)``; on steps where ``step % refresh_every == 0``
    the ``keep`` groups with the highest EMA (ties: lower index) become the ``selection``; ``step += 1``.
    ``keep=None`` takes it from the step itself, on the device: the rows' mean count of groups whose own
    decision executes (``margin >= 0``), rounded half up, at least 1 — so a layer keeps as many groups as its
    router runs per token, whatever rate it learned there; ``keep_scale`` multiplies that count before the
    rounding (at most ``G``): above 1 a step reads more weights and drops fewer of the groups its rows want.

    Args:
        margin: ``[B, G]`` execute-minus-skip margins of the step's rows.
        ema: ``[G]`` float32 activation memory.
        selection: ``[G]`` bool, the groups every row runs.
        step: ``[]`` int64 decode-step counter.
        keep: groups to select, ``1 <= keep <= G``, or None (the rows' mean executing count).
        memory: EMA decay in ``[0, 1)``.
        refresh_every: steps between selections, ``>= 1``.
        keep_scale: factor on the adaptive count (``keep=None`` only), in ``(0, 16]``, taken in steps of 1/64.
        groups: optional ``(order [G] int32, n [1] int32)``, also written: the selected groups ascending, then the
            others, and how many are selected (`RoutingPlan.group_list`'s layout, so a plan of the shared mask
            needs no launch of its own to build it).
        backend: as in `gemm_mn`.

    Returns:
        ``selection`` (updated).
    """
    if margin.dim() != 2 or margin.shape[0] == 0:
        raise ValueError(f"coherent_select: margin {tuple(margin.shape)} must be [B >= 1, G]")
    _check_coherent("coherent_select", margin.shape[1], ema, selection, step, keep, memory, refresh_every, keep_scale,
                    groups, margin.device)
    call = dict(margin=margin, ema=ema, selection=selection, step=step)
    return dispatch.choose("coherent_select", backend, call, margin.device).coherent_select(
        margin, ema, selection, step, keep=keep, memory=memory, refresh_every=refresh_every, keep_scale=keep_scale,
        groups=groups)


@torch.compiler.disable
def coherent_route(x, down, up=None, bias=None, *, ema, selection, step, keep: int | None, memory: float = 0.0,
                   refresh_every: int = 1, keep_scale: float = 1.0, groups: tuple | None = None,
                   normalize: bool = True, eps: float = 1e-6, backend: str = "auto"):
    """A decode step's batch-coherent routing from the residual stream: `router_margin`'s margins of every row,
    then `coherent_select` over them (same arguments, same results), in one launch on the triton backend (the
    rows' programs write their margins and the last one runs the selection).

    Args:
        x: ``[B, 1, D]`` or ``[B, D]``: one decode token per row.
        down, up, bias, normalize, eps: the router, as in `router_margin`.
        ema, selection, step, keep, memory, refresh_every, keep_scale, groups: the state and schedule, as in
            `coherent_select`.

    Returns:
        ``selection`` (updated).
    """
    g = _check_router("coherent_route", x, down, up, bias)
    if x.dim() not in (2, 3) or (x.dim() == 3 and x.shape[1] != 1) or x.shape[0] == 0:
        raise ValueError(f"coherent_route: x {tuple(x.shape)} must be [B >= 1, 1, D] or [B >= 1, D]")
    _check_coherent("coherent_route", g, ema, selection, step, keep, memory, refresh_every, keep_scale, groups,
                    x.device)
    call = dict(x=x, down=down, up=up, bias=bias, ema=ema, selection=selection, step=step)
    return dispatch.choose("coherent_route", backend, call, x.device).coherent_route(
        x, down, up, bias, ema, selection, step, keep=keep, memory=memory, refresh_every=refresh_every,
        keep_scale=keep_scale, groups=groups, normalize=normalize, eps=eps)
