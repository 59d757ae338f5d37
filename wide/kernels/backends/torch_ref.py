"""``torch`` backend: the reference semantics, in plain differentiable PyTorch.

It computes densely and applies the mask afterwards (gemm_mn, SwiGLU, attention) or before
(gemm_k), so it is exact, runs anywhere and supports autograd. A float mask in {0, 1} multiplies
instead of selecting, so a straight-through gradient reaches the router (the training path).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import KernelBackend, register_backend


def expand_groups(mask: torch.Tensor, size: int) -> torch.Tensor:
    """``[..., G_count] -> [..., G_count * size]``: each group's decision repeated over its columns."""
    return mask.repeat_interleave(size, dim=-1)


def apply_mask(y: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Exact zeros where a bool mask is False (even over inf/NaN); a float mask multiplies."""
    if mask.dtype == torch.bool:
        return torch.where(mask, y, y.new_zeros(()))
    return y * mask.to(y.dtype)


def activate(y: torch.Tensor, activation: str | None) -> torch.Tensor:
    if activation is None:
        return y
    if activation == "silu":
        return F.silu(y)
    if activation == "gelu":
        return F.gelu(y)
    if activation == "relu":
        return F.relu(y)
    raise ValueError(f"unknown activation {activation!r} (use None, 'silu', 'gelu' or 'relu')")


def key_keep(B: int, T: int, S: int, causal: bool, lengths: torch.Tensor | None,
             device: torch.device, q_offset: torch.Tensor | None = None) -> torch.Tensor | None:
    """Bool ``[B, 1, T, S]`` of visible keys (query i of row b sits at key position ``q_offset[b] + i``,
    default ``S - T + i``), or None for all."""
    if not causal and lengths is None:
        return None
    j = torch.arange(S, device=device)
    keep = torch.ones(B, 1, T, S, dtype=torch.bool, device=device)
    if causal:
        start = q_offset.view(B, 1, 1, 1).to(device) if q_offset is not None else S - T
        i = torch.arange(T, device=device).view(1, 1, T, 1) + start
        keep = keep & (j.view(1, 1, 1, S) <= i)
    if lengths is not None:
        keep = keep & (j.view(1, 1, 1, S) < lengths.view(B, 1, 1, 1).to(device))
    return keep


def sdpa_reference(q, k, v, keep, scale):
    """``q [B, Hq, T, D]``, ``k/v [B, Hk, S, D]``; rows with no visible key give zeros."""
    hq, hk = q.shape[1], k.shape[1]
    if hq != hk:
        k = k.repeat_interleave(hq // hk, dim=1)
        v = v.repeat_interleave(hq // hk, dim=1)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=scale)
    if keep is not None:
        o = torch.where(keep.any(-1, keepdim=True), o, o.new_zeros(()))
    return o


@register_backend
class TorchBackend(KernelBackend):
    """Reference backend (dense compute, then mask); autograd-capable, accepts float masks."""

    name = "torch"

    def gemm_mn(self, x, weight, mask, *, bias=None, activation=None, plan=None, out=None):
        group = weight.shape[0] // mask.shape[-1]
        y = activate(F.linear(x, weight, bias), activation)
        y = apply_mask(y, expand_groups(mask, group))
        return _into(out, y)

    def swiglu(self, x, gate_weight, up_weight, mask, *, plan=None, out=None):
        group = gate_weight.shape[0] // mask.shape[-1]
        y = F.silu(F.linear(x, gate_weight)) * F.linear(x, up_weight)
        y = apply_mask(y, expand_groups(mask, group))
        return _into(out, y)

    def gemm_k(self, x, weight, mask, *, bias=None, plan=None, out=None, x_masked=False):
        group = x.shape[-1] // mask.shape[-1]
        y = F.linear(apply_mask(x, expand_groups(mask, group)), weight, bias)
        return _into(out, y)

    def ffn_experts(self, x, gate_weight, up_weight, down_weight, mask, *, plan=None, out=None):
        return _into(out, self.gemm_k(self.swiglu(x, gate_weight, up_weight, mask), down_weight, mask))

    def attention_prefill(self, q, k, v, mask, *, causal=True, scale=None, lengths=None, q_offset=None, plan=None,
                          out=None):
        B, T, HQ, D = q.shape
        S = k.shape[1]
        keep = key_keep(B, T, S, causal, lengths, q.device, q_offset)
        o = sdpa_reference(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), keep, scale)
        o = o.transpose(1, 2)
        o = apply_mask(o, expand_groups(mask, HQ // mask.shape[-1]).unsqueeze(-1))
        return _into(out, o)

    def attention_decode(self, q, k, v, mask, *, lengths=None, scale=None, out=None):
        return self.attention_prefill(q, k, v, mask, causal=False, scale=scale, lengths=lengths, out=out)

    def decode_qkv(self, x, q_weight, k_weight, v_weight, mask, *, q_bias=None, k_bias=None, v_bias=None, cos, sin,
                   k_cache, v_cache, position, out=None, eager_rope=False, part="all"):
        B, D = x.shape[0], k_cache.shape[-1]
        c, s = cos.reshape(-1, 1, 1, D).float(), sin.reshape(-1, 1, 1, D).float()
        if part != "q":  # k / v, the cache write and the position bump
            k = F.linear(x, k_weight, k_bias).view(B, 1, -1, D)
            v = F.linear(x, v_weight, v_bias).view(B, 1, -1, D)
            k = rope(k, c, s, eager_rope)
            at = position.reshape(1).long()
            k_cache.index_copy_(2, at, k.transpose(1, 2).to(k_cache.dtype))
            v_cache.index_copy_(2, at, v.transpose(1, 2).to(v_cache.dtype))
            position.add_(1)
        if part == "kv":
            return None
        q = rope(F.linear(x, q_weight, q_bias).view(B, 1, -1, D), c, s, eager_rope)
        if mask is not None:
            q = apply_mask(q, expand_groups(mask, q.shape[2] // mask.shape[-1]).unsqueeze(-1))
        return _into(out, q)

    def router_margin(self, x, down, up, bias, *, normalize=True, eps=1e-6, decide=True):
        h = F.rms_norm(x.float(), (x.shape[-1],), eps=eps) if normalize else x
        m = F.linear(h.to(down.dtype), down, bias if up is None else None)
        if up is not None:
            m = F.linear(m, up, bias)
        return m >= 0 if decide else m.float()

    def rms_norm_route(self, x, norm_weight, norm_eps, down, up, bias, *, normalize=True, eps=1e-6):
        return hf_rms_norm(x, norm_weight, norm_eps), self.router_margin(x, down, up, bias, normalize=normalize,
                                                                         eps=eps)

    def gemm_k_route(self, x, weight, mask, residual, norm_weight, norm_eps, down, up, bias, *, normalize=True,
                     eps=1e-6, plan=None, x_masked=False):
        h = self.gemm_k(x, weight, mask, plan=plan).add_(residual)
        y, decisions = self.rms_norm_route(h, norm_weight, norm_eps, down, up, bias, normalize=normalize, eps=eps)
        return h, y, decisions

    def coherent_select(self, margin, ema, selection, step, *, keep, memory=0.0, refresh_every=1, keep_scale=1.0,
                        groups=None):
        ema.lerp_(torch.sigmoid(margin.float()).mean(dim=0), 1.0 - memory)
        order = torch.sort(ema, descending=True, stable=True).indices  # ties: lower index first
        if keep is None:  # the rows' mean executing count (times the scale), rounded half up, on the device
            b, g, s64 = margin.shape[0], margin.shape[1], round(keep_scale * 64)  # integer math: exact everywhere
            keep = (2 * s64 * (margin >= 0).sum() + 64 * b).div(128 * b, rounding_mode="floor").clamp(1, g)
        # the first ``keep`` places of the ranking, scattered back to their groups
        fresh = torch.zeros_like(selection).scatter_(0, order, torch.arange(order.numel(), device=order.device) < keep)
        if refresh_every == 1:
            selection.copy_(fresh)
        else:  # decided on the device, so a captured step keeps its schedule on every replay
            selection.copy_(torch.where(torch.remainder(step, refresh_every) == 0, fresh, selection))
        step.add_(1)
        if groups is not None:  # selected groups ascending, then the others (a stable sort of "not selected")
            groups[0].copy_(torch.sort((~selection).to(torch.uint8), stable=True).indices)
            groups[1].copy_(selection.sum().view(1))
        return selection

    def coherent_route(self, x, down, up, bias, ema, selection, step, *, keep, memory=0.0, refresh_every=1,
                       keep_scale=1.0, groups=None, normalize=True, eps=1e-6):
        margin = self.router_margin(x.reshape(x.shape[0], x.shape[-1]), down, up, bias, normalize=normalize, eps=eps,
                                    decide=False)
        return self.coherent_select(margin, ema, selection, step, keep=keep, memory=memory,
                                    refresh_every=refresh_every, keep_scale=keep_scale, groups=groups)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eager: bool = False) -> torch.Tensor:
    """HF's ``x * cos + rotate_half(x) * sin`` in fp32, rounded once to ``x``'s dtype (what compiled glue computes);
    ``eager``: each product rounded to ``x``'s dtype, then the sum (eager transformers in 16-bit)."""
    x32 = x.float()
    half = x.shape[-1] // 2
    rot = torch.cat([-x32[..., half:], x32[..., :half]], dim=-1)
    if eager:
        return ((x32 * cos).to(x.dtype).float() + (rot * sin).to(x.dtype).float()).to(x.dtype)
    return (x32 * cos + rot * sin).to(x.dtype)


def hf_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF LlamaRMSNorm / Qwen2RMSNorm (``weight * normed``, not Gemma's ``1 + weight``), in ``x``'s dtype:
    ``weight * (x32 * rsqrt(mean(x32^2) + eps)).to(x.dtype)`` with the product taken in fp32 and rounded once
    (exactly HF's product when ``weight`` has ``x``'s dtype: two 16-bit values multiply exactly in fp32)."""
    x32 = x.float()
    h = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (weight.float() * h.to(x.dtype).float()).to(x.dtype)


def _into(out: torch.Tensor | None, y: torch.Tensor) -> torch.Tensor:
    if out is None:
        return y
    out.copy_(y)
    return out
