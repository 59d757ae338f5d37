"""``triton`` backend: fused routed kernels (mask reordering, block- and row-level skipping).

This module only verifies and delegates: each op's verifier rejects what the kernels do not cover (reason given;
the dispatcher then falls back to the ``torch`` reference), and each op hands the call to its op family's host
function in `wide.kernels.triton` (path, config, launch). Triton is imported only when a call reaches one, so
``import wide.kernels`` works without it. On a machine without CUDA the backend still runs when
``TRITON_INTERPRET=1`` (CPU tensors through Triton's interpreter: the test suite's mode).
"""

from __future__ import annotations

import importlib.util

import torch

from ..triton.common import interpreting
from .base import KernelBackend, register_backend

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_ACTS = (None, "silu", "gelu", "relu")


def _device_ok(*tensors) -> tuple[bool, str]:
    # every routed call asks this: the common case (one CUDA device) from ints, without building device objects
    # (a prefill layer makes ~7 calls; on the H200's host each `t.device` costs about a microsecond)
    first = tensors[0]
    if first is not None and first.is_cuda:
        idx = first.get_device()
        if all(t is None or (t.is_cuda and t.get_device() == idx) for t in tensors):
            return True, ""
    devs = {t.device for t in tensors if t is not None}
    if len(devs) != 1:
        return False, f"tensors on several devices {sorted(map(str, devs))}"
    dev = devs.pop()
    if dev.type == "cuda" or (dev.type == "cpu" and interpreting()):
        return True, ""
    return False, f"tensors on {dev.type} (needs CUDA, or TRITON_INTERPRET=1 on CPU)"


def _common(mask, *tensors, float_dtype=None) -> tuple[bool, str]:
    """Mask (``None``: an op that may run unmasked), autograd, device and dtype checks of a call."""
    if mask is not None and mask.dtype != torch.bool:
        return False, f"needs a bool mask (got {mask.dtype}; float masks are the training path)"
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        return False, "autograd is not supported (forward-only backend)"
    ok, why = _device_ok(*((mask,) if mask is not None else ()), *tensors)
    if not ok:
        return ok, why
    dtype = float_dtype or tensors[0].dtype
    if dtype not in _DTYPES:
        return False, f"dtype {dtype} not in fp16/bf16/fp32"
    for t in tensors:
        if t is not None and t.dtype != dtype:
            return False, f"mixed dtypes {dtype} and {t.dtype}"
    return True, ""


def _out_ok(out, shape, dtype) -> tuple[bool, str]:
    if out is None:
        return True, ""
    if tuple(out.shape) != tuple(shape) or out.dtype != dtype:
        return False, f"out is {tuple(out.shape)} {out.dtype}, expected {tuple(shape)} {dtype}"
    if not out.is_contiguous():
        return False, "out must be contiguous"
    return True, ""


def _gemm_group_ok(total: int, ng: int, what: str) -> tuple[bool, str]:
    group = total // ng
    if group % 16:
        return False, f"{what} group size {group} is not a multiple of 16"
    return True, ""


@register_backend
class TritonBackend(KernelBackend):
    """Fused Triton kernels (forward only, bool masks, CUDA or the Triton interpreter)."""

    name = "triton"
    auto_devices = ("cuda",)
    priority = 10
    takes_density = True
    takes_residual = True

    _importable: bool | None = None  # fixed for the process, like the CUDA probe below
    _found: bool | None = None  # importable and a CUDA device present

    @classmethod
    def is_available(cls) -> bool:
        # asked once per routed call: the import search and the CUDA probe once, the interpreter switch each time
        if cls._found is None:
            cls._importable = importlib.util.find_spec("triton") is not None
            cls._found = cls._importable and torch.cuda.is_available()
        return cls._found or (cls._importable and interpreting())

    # ---- verifiers ----------------------------------------------------------------------------

    def verify_gemm_mn(self, x, weight, mask, bias=None, activation=None, out=None, **_):
        ok, why = _common(mask, x, weight, bias)
        if ok and activation not in _ACTS:
            ok, why = False, f"activation {activation!r} not fused"
        if ok:
            ok, why = _gemm_group_ok(weight.shape[0], mask.shape[-1], "output")
        if ok:
            ok, why = _out_ok(out, (*x.shape[:-1], weight.shape[0]), x.dtype)
        return ok, why

    def verify_swiglu(self, x, gate_weight, up_weight, mask, out=None, **_):
        ok, why = _common(mask, x, gate_weight, up_weight)
        if ok:
            ok, why = _gemm_group_ok(gate_weight.shape[0], mask.shape[-1], "output")
        if ok:
            ok, why = _out_ok(out, (*x.shape[:-1], gate_weight.shape[0]), x.dtype)
        return ok, why

    def verify_gemm_k(self, x, weight, mask, bias=None, out=None, **_):
        ok, why = _common(mask, x, weight, bias)
        if ok:
            ok, why = _gemm_group_ok(x.shape[-1], mask.shape[-1], "reduction")
        if ok:
            ok, why = _out_ok(out, (*x.shape[:-1], weight.shape[0]), x.dtype)
        return ok, why

    def verify_ffn_experts(self, x, gate_weight, up_weight, down_weight, mask, out=None, **_):
        ok, why = _common(mask, x, gate_weight, up_weight, down_weight)
        if ok:  # the per-tile path's tiles (the expert path takes any width)
            ok, why = _gemm_group_ok(gate_weight.shape[0], mask.shape[-1], "FFN")
        if ok:
            ok, why = _out_ok(out, (*x.shape[:-1], down_weight.shape[0]), x.dtype)
        return ok, why

    def _verify_attention(self, q, k, v, mask, lengths, out) -> tuple[bool, str]:
        ok, why = _common(mask, q, k, v)
        if not ok:
            return ok, why
        D = q.shape[-1]
        if D not in (16, 32, 64, 128, 256):
            return False, f"head_dim {D} not in 16/32/64/128/256"
        HQ, HK = q.shape[2], k.shape[2]
        hu = min(HQ // mask.shape[-1], HQ // HK)
        if hu > 64:
            return False, f"{hu} heads per (group, kv head) is more than 64"
        if lengths is not None:
            if lengths.dtype not in (torch.int32, torch.int64) or lengths.device != q.device:
                return False, "lengths must be an int32/int64 tensor on the device of q"
        return _out_ok(out, q.shape, q.dtype)

    def verify_attention_prefill(self, q, k, v, mask, lengths=None, out=None, q_offset=None, **_):
        ok, why = self._verify_attention(q, k, v, mask, lengths, out)
        if ok and q_offset is not None and (q_offset.dtype not in (torch.int32, torch.int64)
                                            or q_offset.device != q.device):
            ok, why = False, "q_offset must be an int32/int64 tensor on the device of q"
        return ok, why

    def verify_attention_decode(self, q, k, v, mask, lengths=None, out=None, **_):
        ok, why = self._verify_attention(q, k, v, mask, lengths, out)
        if ok and q.shape[2] // k.shape[2] > 128:
            ok, why = False, "more than 128 query heads per kv head"
        return ok, why

    def verify_router_margin(self, x, down, up=None, bias=None, **_):
        if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, down, up, bias)):
            return False, "autograd is not supported (forward-only backend)"
        ok, why = _device_ok(x, down, up, bias)
        if not ok:
            return ok, why
        for t in (x, down, up, bias):
            if t is not None and t.dtype not in _DTYPES:
                return False, f"dtype {t.dtype} not in fp16/bf16/fp32"
        if down.shape[0] > 128 and up is not None:
            return False, f"rank {down.shape[0]} > 128"
        if down.shape[0] > 1024:
            return False, f"{down.shape[0]} outputs > 1024"
        if down.stride(-1) != 1 or (up is not None and up.stride(-1) != 1):
            return False, "weights need a contiguous last dimension"
        return True, ""

    def verify_coherent_select(self, margin, ema, selection, step, **_):
        ok, why = _device_ok(margin, ema, selection, step)
        if ok and margin.dtype not in _DTYPES:
            ok, why = False, f"dtype {margin.dtype} not in fp16/bf16/fp32"
        if ok and margin.shape[1] > 4096:
            ok, why = False, f"{margin.shape[1]} groups > 4096"
        if ok and not (margin.stride(-1) == 1 and ema.is_contiguous() and selection.is_contiguous()):
            ok, why = False, "needs contiguous groups"
        return ok, why

    def verify_coherent_route(self, x, down, up, bias, ema, selection, step, **_):
        ok, why = self.verify_router_margin(x, down, up, bias)
        rows = x.numel() // max(1, x.shape[-1])
        if ok and rows > 64:  # the decode kernel: up to 64 programs per row over the router's columns
            ok, why = False, f"{rows} rows: a decode batch of at most 64 rows"
        if ok:
            ok, why = _device_ok(x, ema, selection, step)
        g = up.shape[0] if up is not None else down.shape[0]
        if ok and g > 4096:
            ok, why = False, f"{g} groups > 4096"
        if ok and not (ema.is_contiguous() and selection.is_contiguous()):
            ok, why = False, "needs a contiguous state"
        return ok, why

    def verify_decode_qkv(self, x, q_weight, k_weight, v_weight, mask, q_bias=None, k_bias=None, v_bias=None,
                          cos=None, sin=None, k_cache=None, v_cache=None, position=None, out=None, **_):
        ok, why = _common(mask, x, q_weight, k_weight, v_weight, q_bias, k_bias, v_bias, k_cache, v_cache)
        if ok:
            ok, why = _device_ok(x, cos, sin, position)
        if ok and (cos.dtype not in _DTYPES or sin.dtype not in _DTYPES):
            ok, why = False, f"cos / sin dtype {cos.dtype} / {sin.dtype} not in fp16/bf16/fp32"
        if ok and not all(w.is_contiguous() for w in (q_weight, k_weight, v_weight)):
            ok, why = False, "q / k / v weights must be contiguous"
        if ok and (k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1 or cos.stride(-1) != 1 or sin.stride(-1) != 1):
            ok, why = False, "the caches and cos / sin need a contiguous last dimension"
        if ok and (k_cache.shape[-1] < 32 or k_cache.shape[-1] & (k_cache.shape[-1] - 1)):
            ok, why = False, f"head dim {k_cache.shape[-1]} is not a power of two >= 32"
        if ok and x.shape[0] > 16:
            ok, why = False, f"{x.shape[0]} rows > 16 (one 16-row tile per head)"
        if ok:
            ok, why = _out_ok(out, (x.shape[0], 1, q_weight.shape[0] // k_cache.shape[-1], k_cache.shape[-1]),
                              x.dtype)
        return ok, why

    def verify_rms_norm_route(self, x, norm_weight, down, up=None, bias=None, **_):
        ok, why = self.verify_router_margin(x, down, up, bias)
        if ok:
            ok, why = _device_ok(x, norm_weight)
        if ok and torch.is_grad_enabled() and norm_weight.requires_grad:
            ok, why = False, "autograd is not supported (forward-only backend)"
        if ok and norm_weight.dtype not in _DTYPES:
            ok, why = False, f"dtype {norm_weight.dtype} not in fp16/bf16/fp32"
        if ok and norm_weight.stride(-1) != 1:
            ok, why = False, "the norm weight needs a contiguous last dimension"
        return ok, why

    def verify_gemm_k_route(self, x, weight, mask, residual, norm_weight, down, up=None, bias=None, plan=None, **_):
        ok, why = self.verify_gemm_k(x, weight, mask)
        if ok:
            ok, why = self.verify_rms_norm_route(residual, norm_weight, down, up, bias)
        if ok and x.numel() != x.shape[-1]:
            ok, why = False, f"{x.numel() // max(x.shape[-1], 1)} rows (the fused epilogue takes one)"
        if ok and (residual.stride(-1) != 1 or not weight.is_contiguous()):
            ok, why = False, "the residual and weight need contiguous rows"
        if ok and down.shape[0] > 128:
            ok, why = False, f"router rank {down.shape[0]} > 128"
        return ok, why

    # ---- ops: the op families' host functions ----------------------------------------------

    def gemm_mn(self, x, weight, mask, *, bias=None, activation=None, plan=None, out=None, config=None):
        from ..triton import gemm_mn as host

        return host.gemm_mn(x, weight, None, mask, bias, activation, False, plan, out, config)

    def swiglu(self, x, gate_weight, up_weight, mask, *, plan=None, out=None, config=None):
        from ..triton import gemm_mn as host

        return host.gemm_mn(x, gate_weight, up_weight, mask, None, None, True, plan, out, config)

    def gemm_k(self, x, weight, mask, *, bias=None, plan=None, out=None, x_masked=False, config=None, residual=None):
        from ..triton import gemm_k as host

        return host.gemm_k(x, weight, mask, bias, plan, out, x_masked, config, residual=residual)

    def gemm_k_route(self, x, weight, mask, residual, norm_weight, norm_eps, down, up, bias, *, normalize=True,
                     eps=1e-6, plan=None, x_masked=False, config=None):
        from ..triton import gemm_k as host

        return host.gemm_k_route(x, weight, mask, residual, norm_weight, norm_eps, down, up, bias, normalize, eps,
                                 plan, x_masked, config)

    def ffn_experts(self, x, gate_weight, up_weight, down_weight, mask, *, plan=None, out=None, path=None, gmm=None,
                    partial_dtype=None):
        from ..triton import experts as host

        return host.ffn_experts(x, gate_weight, up_weight, down_weight, mask, plan, out, path, gmm, partial_dtype)

    def attention_prefill(self, q, k, v, mask, *, causal=True, scale=None, lengths=None, q_offset=None, plan=None,
                          out=None, config=None):
        from ..triton import attention as host

        return host.attention_prefill(q, k, v, mask, causal, scale, lengths, q_offset, plan, out, config)

    def coherent_route(self, x, down, up, bias, ema, selection, step, *, keep, memory=0.0, refresh_every=1,
                       keep_scale=1.0, groups=None, normalize=True, eps=1e-6):
        from ..triton import router as host

        return host.coherent_route(x, down, up, bias, normalize, eps, ema, selection, step, keep, memory,
                                   refresh_every, keep_scale, groups)

    def router_margin(self, x, down, up, bias, *, normalize=True, eps=1e-6, decide=True):
        from ..triton import router as host

        return host.router_margin(x, down, up, bias, normalize, eps, decide)

    def decode_qkv(self, x, q_weight, k_weight, v_weight, mask, *, q_bias=None, k_bias=None, v_bias=None, cos, sin,
                   k_cache, v_cache, position, out=None, eager_rope=False, part="all"):
        from ..triton import decode_qkv as host

        return host.decode_qkv(x, q_weight, k_weight, v_weight, mask, q_bias, k_bias, v_bias, cos, sin, k_cache,
                               v_cache, position, out, eager_rope=eager_rope, part=part)

    def rms_norm_route(self, x, norm_weight, norm_eps, down, up, bias, *, normalize=True, eps=1e-6):
        from ..triton import router as host

        return host.rms_norm_route(x, norm_weight, norm_eps, down, up, bias, normalize, eps)

    def coherent_select(self, margin, ema, selection, step, *, keep, memory=0.0, refresh_every=1, keep_scale=1.0,
                        groups=None):
        from ..triton import coherent as host

        return host.coherent_select(margin, ema, selection, step, keep, memory, refresh_every, keep_scale, groups)

    def attention_decode(self, q, k, v, mask, *, lengths=None, scale=None, out=None, config=None, density=None):
        from ..triton import attention as host

        return host.attention_decode(q, k, v, mask, lengths, scale, out, config, density)
