"""A decode step's layer norm and router in one launch (`KernelOptions.decode_norm_route`, off by default).

Each routed layer's router reads the pre-norm residual that the layer's RMSNorm reads (``input_layernorm`` before
attention, ``post_attention_layernorm`` before the FFN). With the switch on, a decode step (one token per row, at
most 64 rows) with per-token routing runs `wide.kernels.rms_norm_route` from the norm's routing pre-hook: one launch
writes the norm's output and the router's decisions. The norm's forward, wrapped at `enable_kernels`
(`install`), then returns that output for the same input tensor instead of computing it (the launch saved; the
wrapper sits outside `wide.fuse_glue`'s compiled forward, which `fuse_glue` installs under it).

Everything else — prefill, training, coherent decode, forced masks, routers or policies whose eval decision is not
`router_margin` of the router's `margin_weights`, Gemma-style norms (``1 + weight``), a norm weight of another
dtype than the residual, the attention router on its side stream — takes the usual hook and the norm's own forward.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from wide.modeling.seam import is_hf_form, wrap_forward
from wide.policies.base import Policy, RouterSlot

_PLAIN_FORMS = ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm")
"""HF norms computing ``weight * (x32 * rsqrt(mean(x32^2) + eps)).to(x.dtype)`` (not Gemma's ``1 + weight``)."""
INNER = "_wide_inner_forward"


def is_plain_rms_norm(module: nn.Module) -> bool:
    """Whether ``module`` is an HF RMSNorm of the Llama / Qwen form that `wide.kernels.rms_norm_route` computes."""
    weight = getattr(module, "weight", None)
    return (is_hf_form(module, _PLAIN_FORMS) and isinstance(weight, torch.Tensor) and weight.dim() == 1
            and isinstance(getattr(module, "variance_epsilon", None), float))


def _forward(self: nn.Module, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    pending, self._wide_norm_out = self._wide_norm_out, None
    if pending is not None and pending[0] is hidden_states and not args and not kwargs:
        return pending[1]
    return getattr(self, INNER)(hidden_states, *args, **kwargs)


def install(norm: nn.Module) -> None:
    """Wraps ``norm``'s forward (once): a result `norm_route` left for its input is returned, else it computes.
    The wrapped forward (the class's, or `fuse_glue`'s compiled one) is kept as ``norm._wide_inner_forward``."""
    wrap_forward(norm, INNER, _forward, _wide_norm_out=None)


def route_weights(wl, slot: RouterSlot, residual: torch.Tensor, norm: nn.Module, rows: int = 64):
    """``(norm weight, norm eps, down, up, bias, normalize)`` when a decode step's norm and router over ``residual``
    (``[B, 1, D]``, ``B <= rows``) may run fused in one launch, else ``None`` (module docstring)."""
    if INNER not in vars(norm) or not wl.use_kernels():
        return None
    if residual.dim() != 3 or residual.shape[1] != 1 or not 0 < residual.shape[0] <= rows:
        return None
    if wl.forced or wl.runtime.coherent is not None or torch.compiler.is_compiling():
        return None
    policy = type(wl.policy)
    if policy.mask is not Policy.mask or policy.eval_mask is not Policy.eval_mask:
        return None  # the policy decides otherwise than the router's execute decision
    weights = wl.routers[slot.kind].margin_weights()
    weight = norm.weight
    if weights is None or weight.dtype != residual.dtype or weight.device != residual.device:
        return None
    down, up, bias, normalize = weights
    return weight, norm.variance_epsilon, down, up, bias, normalize


def hand_over(norm: nn.Module, residual: torch.Tensor, y: torch.Tensor) -> None:
    """Leaves the norm's output ``y`` for ``residual`` (computed in another launch): its next forward of that tensor
    returns it."""
    norm._wide_norm_out = (residual, y)


def norm_route(wl, slot: RouterSlot, residual: torch.Tensor, norm: nn.Module) -> Optional[torch.Tensor]:
    """The mask ``[B, 1, G]`` of ``slot`` for this decode step from one `rms_norm_route` launch, whose norm output
    is left for ``norm``'s forward; ``None`` (nothing run) when the call does not qualify (module docstring)."""
    from wide.kernels import kernel_options, rms_norm_route

    if not kernel_options().decode_norm_route:
        return None
    args = route_weights(wl, slot, residual, norm)
    if args is None:
        return None
    weight, eps, down, up, bias, normalize = args
    y, mask = rms_norm_route(residual, weight, eps, down, up, bias, normalize=normalize, backend=wl.backend)
    hand_over(norm, residual, y)
    return mask
