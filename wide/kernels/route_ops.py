"""Public routing ops: they make the masks the routed ops read (eval mode, one launch each on the triton backend).
Each validates shapes, picks a backend per call and runs it (`wide.kernels.dispatch`).

- `router_margin`: a linear / low-rank router's execute-minus-skip margin or decision;
- `rms_norm_route`: a layer's HF RMSNorm output with its router's decisions (one launch for both at a decode step);
- `gemm_k_route`: a decode step's closing `gemm_k` with its residual add, then the next norm and router;
- `coherent_select`: batch-coherent decode's shared top-k with its EMA memory and refresh schedule;
- `coherent_route`: `router_margin` and `coherent_select` in one launch for a decode step.

Like `wide.kernels.ops`, each is a graph break under ``torch.compile`` (``torch.compiler.disable``).
"""

from __future__ import annotations

import torch

from . import dispatch
from .ops import _divides, _leading
from .plan import RoutingPlan


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
