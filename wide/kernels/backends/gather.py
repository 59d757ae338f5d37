"""``gather`` backend: the naive routed baseline.

Per group: gather the active tokens (from the routing plan), run a dense op on them, scatter the
result back. It moves the gathered copies through memory and launches a few kernels per group, and
reads the per-group counts on the host (one synchronization per call), so it is the yardstick the
fused ``triton`` backend has to beat, not a fast path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..plan import RoutingPlan
from .base import KernelBackend, register_backend
from .torch_ref import activate, sdpa_reference


def _check_bool(mask: torch.Tensor) -> tuple[bool, str]:
    if mask.dtype != torch.bool:
        return False, f"needs a bool mask (got {mask.dtype}; float masks are the training path)"
    return True, ""


def _no_grad_needed(*tensors) -> tuple[bool, str]:
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        return False, "autograd is not supported (forward-only backend)"
    return True, ""


def _verify_common(mask, *tensors) -> tuple[bool, str]:
    ok, why = _check_bool(mask)
    if ok:
        ok, why = _no_grad_needed(*tensors)
    return ok, why


@register_backend
class GatherBackend(KernelBackend):
    """Gather active tokens per group -> dense op -> scatter (forward only, bool masks)."""

    name = "gather"

    def verify_gemm_mn(self, x, weight, mask, bias=None, **_):
        return _verify_common(mask, x, weight, bias)

    def verify_swiglu(self, x, gate_weight, up_weight, mask, **_):
        return _verify_common(mask, x, gate_weight, up_weight)

    def verify_gemm_k(self, x, weight, mask, bias=None, **_):
        return _verify_common(mask, x, weight, bias)

    def verify_attention_prefill(self, q, k, v, mask, **_):
        return _verify_common(mask, q, k, v)

    def verify_attention_decode(self, q, k, v, mask, **_):
        return _verify_common(mask, q, k, v)

    # ---- GEMMs --------------------------------------------------------------------------------

    def _mn(self, x, weights, mask, bias, plan, out, fn):
        K = x.shape[-1]
        N = weights[0].shape[0]
        ng = mask.shape[-1]
        group = N // ng
        x2 = x.reshape(-1, K)
        out2 = (out if out is not None else x.new_empty(*x.shape[:-1], N)).view(-1, N)
        out2.zero_()
        plan = plan if plan is not None else RoutingPlan(mask)
        perm, counts = plan.token_order(flat=True)
        for g, c in enumerate(counts.view(-1).tolist()):
            if c == 0:
                continue
            idx = perm[0, g, :c].long()
            cols = slice(g * group, (g + 1) * group)
            xs = x2.index_select(0, idx)
            y = fn(xs, [w[cols] for w in weights], None if bias is None else bias[cols])
            out2[:, cols].index_copy_(0, idx, y.to(out2.dtype))
        return out2.view(*x.shape[:-1], N)

    def gemm_mn(self, x, weight, mask, *, bias=None, activation=None, plan=None, out=None):
        return self._mn(x, [weight], mask, bias, plan, out,
                        lambda xs, ws, b: activate(F.linear(xs, ws[0], b), activation))

    def swiglu(self, x, gate_weight, up_weight, mask, *, plan=None, out=None):
        return self._mn(x, [gate_weight, up_weight], mask, None, plan, out,
                        lambda xs, ws, b: F.silu(F.linear(xs, ws[0])) * F.linear(xs, ws[1]))

    def gemm_k(self, x, weight, mask, *, bias=None, plan=None, out=None, x_masked=False):
        K = x.shape[-1]
        N = weight.shape[0]
        ng = mask.shape[-1]
        group = K // ng
        x2 = x.reshape(-1, K)
        plan = plan if plan is not None else RoutingPlan(mask)
        perm, counts = plan.token_order(flat=True)
        acc = torch.zeros(x2.shape[0], N, device=x.device, dtype=torch.float32)
        for g, c in enumerate(counts.view(-1).tolist()):  # groups in order: deterministic sum
            if c == 0:
                continue
            idx = perm[0, g, :c].long()
            cols = slice(g * group, (g + 1) * group)
            acc.index_add_(0, idx, F.linear(x2[idx, cols], weight[:, cols]).float())
        if bias is not None:
            acc += bias.float()
        res = acc.to(x.dtype).view(*x.shape[:-1], N)
        if out is None:
            return res
        out.copy_(res)
        return out

    def verify_ffn_experts(self, x, gate_weight, up_weight, down_weight, mask, **_):
        return _verify_common(mask, x, gate_weight, up_weight, down_weight)

    def ffn_experts(self, x, gate_weight, up_weight, down_weight, mask, *, plan=None, out=None):
        """Per group: its tokens' rows of x -> SwiGLU -> their partial down rows, added in group order (fp32)."""
        K, N = x.shape[-1], down_weight.shape[0]
        width = gate_weight.shape[0] // mask.shape[-1]
        x2 = x.reshape(-1, K)
        plan = plan if plan is not None else RoutingPlan(mask)
        perm, counts = plan.token_order(flat=True)
        acc = torch.zeros(x2.shape[0], N, device=x.device, dtype=torch.float32)
        for g, c in enumerate(counts.view(-1).tolist()):  # groups in order: a deterministic sum
            if c == 0:
                continue
            idx = perm[0, g, :c].long()
            cols = slice(g * width, (g + 1) * width)
            xs = x2.index_select(0, idx)
            h = F.silu(F.linear(xs, gate_weight[cols])) * F.linear(xs, up_weight[cols])
            acc.index_add_(0, idx, F.linear(h, down_weight[:, cols]).float())
        res = acc.to(x.dtype).view(*x.shape[:-1], N)
        if out is None:
            return res
        out.copy_(res)
        return out

    # ---- attention ----------------------------------------------------------------------------

    def attention_prefill(self, q, k, v, mask, *, causal=True, scale=None, lengths=None, q_offset=None, plan=None,
                          out=None):
        B, T, HQ, D = q.shape
        S, HK = k.shape[1], k.shape[2]
        ng = mask.shape[-1]
        gsize = HQ // ng
        qpk = HQ // HK
        out = out if out is not None else torch.empty_like(q)
        out.zero_()
        plan = plan if plan is not None else RoutingPlan(mask)
        perm, counts = plan.token_order(flat=False)
        counts_h = counts.tolist()
        lens_h = lengths.tolist() if lengths is not None else [S] * B
        offs_h = q_offset.tolist() if q_offset is not None else [S - T] * B
        j = torch.arange(S, device=q.device)
        for b in range(B):
            for g in range(ng):
                c = counts_h[b][g]
                if c == 0:
                    continue
                idx = perm[b, g, :c].long()
                heads = torch.arange(g * gsize, (g + 1) * gsize, device=q.device)
                qs = q[b].index_select(0, idx)[:, heads].transpose(0, 1)  # [hg, c, D]
                kv_heads = heads // qpk
                ks = k[b][:, kv_heads].transpose(0, 1)  # [hg, S, D]
                vs = v[b][:, kv_heads].transpose(0, 1)
                keep = j[None, :] < lens_h[b]
                if causal:
                    keep = keep & (j[None, :] <= (idx + offs_h[b])[:, None])
                else:
                    keep = keep.expand(c, S)
                o = sdpa_reference(qs[None], ks[None], vs[None], keep.view(1, 1, c, S), scale)[0]
                out[b, :, g * gsize:(g + 1) * gsize].index_copy_(0, idx, o.transpose(0, 1).to(out.dtype))
        return out

    def attention_decode(self, q, k, v, mask, *, lengths=None, scale=None, out=None):
        return self.attention_prefill(q, k, v, mask, causal=False, scale=scale, lengths=lengths, out=out)
