"""``triton`` backend: fused routed kernels (mask reordering, block- and row-level skipping).

Triton is imported only when a call reaches this backend, so ``import wide.kernels`` works without
it. Verifiers reject what the kernels do not cover (reason given); the dispatcher then falls back to
the ``torch`` reference. On a machine without CUDA the backend still runs when ``TRITON_INTERPRET=1``
(CPU tensors through Triton's interpreter: the test suite's mode).
"""

from __future__ import annotations

import importlib.util
import os
import weakref

import torch

from ..plan import RoutingPlan
from .base import KernelBackend, register_backend

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_ACTS = (None, "silu", "gelu", "relu")


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


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
    if dev.type == "cuda" or (dev.type == "cpu" and _interpreting()):
        return True, ""
    return False, f"tensors on {dev.type} (needs CUDA, or TRITON_INTERPRET=1 on CPU)"


def _common(mask, *tensors, float_dtype=None) -> tuple[bool, str]:
    if mask.dtype != torch.bool:
        return False, f"needs a bool mask (got {mask.dtype}; float masks are the training path)"
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        return False, "autograd is not supported (forward-only backend)"
    ok, why = _device_ok(mask, *tensors)
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
    if _capturing(w):  # made inside a graph capture, the halves only exist once it replays: not for eager calls
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
    from ..triton import router as tr

    if x.stride(-1) != 1:
        x = x.contiguous()
    split = x.dtype in (torch.float16, torch.bfloat16) and down.dtype == torch.float32
    if split:
        h = _mm_fp32(x, _halves(down, x.dtype))
    elif x.dtype in (torch.float16, torch.bfloat16):
        h = _mm_fp32(x, down.to(x.dtype))
    else:
        h = torch.nn.functional.linear(x, down.to(x.dtype)).float()
    return tr.router_tail(x, h, split, up, bias, normalize, eps, decide)


def _capturing(t: torch.Tensor) -> bool:
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def _plan_for(mask: torch.Tensor, plan: RoutingPlan | None) -> RoutingPlan:
    if plan is None:
        return RoutingPlan(mask)
    if not plan.matches(mask):
        raise ValueError(f"plan was built for a mask of shape {tuple(plan.shape)}, not this one "
                         f"({tuple(mask.shape)}, or another tensor)")
    return plan


def _gemm_group_ok(total: int, ng: int, what: str) -> tuple[bool, str]:
    group = total // ng
    if group % 16:
        return False, f"{what} group size {group} is not a multiple of 16"
    return True, ""


@register_backend
class TritonBackend(KernelBackend):
    """Fused Triton kernels (forward only, bool masks, CUDA or the Triton interpreter)."""

    name = "triton"

    _importable: bool | None = None  # fixed for the process, like the CUDA probe below
    _found: bool | None = None  # importable and a CUDA device present

    @classmethod
    def is_available(cls) -> bool:
        # asked once per routed call: the import search and the CUDA probe once, the interpreter switch each time
        if cls._found is None:
            cls._importable = importlib.util.find_spec("triton") is not None
            cls._found = cls._importable and torch.cuda.is_available()
        return cls._found or (cls._importable and _interpreting())

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

    # ---- ops ----------------------------------------------------------------------------------

    def _mn(self, x, w, w2, mask, bias, act, swiglu, plan, out, config):
        from ..triton import gemm as tg

        K = x.shape[-1]
        N = w.shape[0]
        ng = mask.shape[-1]
        group = N // ng
        x2 = x.reshape(-1, K)
        M = x2.shape[0]
        out = out if out is not None else x.new_empty(*x.shape[:-1], N)
        out2 = out.view(-1, N)
        if M == 0:
            return out
        act_id = tg.ACTIVATIONS[act]
        hinted = plan is not None and plan.density_hint is not None
        if config is None and M >= tg.DENSE_MIN_M and (hinted or not _capturing(x)):
            # a hinted plan chooses with no host read, so under stream capture too (a routed model at 0% then
            # captures cuBLAS, as its eager run does); an unhinted one measures its mask, which capture forbids
            plan = _plan_for(mask, plan)
            if plan.expected_density() >= tg.dense_density(group):
                config = ("dense", None)
        if config is None:
            kernel, cfg = tg.default_mn_config(M, N, K, group, swiglu)
            cfg = tg.for_element_size(cfg, x.element_size())
        else:
            kernel, cfg = config
        if kernel == "dense":
            mask2 = mask.reshape(-1, ng).view(torch.uint8)
            all_active = not _capturing(x) and _plan_for(mask, plan).known_all_active()
            tg.gemm_mn_dense(x2, w, w2, bias, out2, mask2, group, act_id, swiglu, all_active)
        elif kernel == "direct":
            mask2 = mask.reshape(-1, ng).view(torch.uint8)
            tg.gemm_mn_direct(x2, w, w2, bias, out2, mask2, group, act_id, swiglu, cfg)
        else:
            perm, counts = _plan_for(mask, plan).token_order(flat=True)
            tg.gemm_mn_perm(x2, w, w2, bias, out2, perm[0], counts[0], group, act_id, swiglu, cfg)
        return out

    def gemm_mn(self, x, weight, mask, *, bias=None, activation=None, plan=None, out=None, config=None):
        return self._mn(x, weight, None, mask, bias, activation, False, plan, out, config)

    def swiglu(self, x, gate_weight, up_weight, mask, *, plan=None, out=None, config=None):
        return self._mn(x, gate_weight, up_weight, mask, None, None, True, plan, out, config)

    def gemm_k(self, x, weight, mask, *, bias=None, plan=None, out=None, x_masked=False, config=None):
        from ..triton import gemm as tg

        K = x.shape[-1]
        N = weight.shape[0]
        ng = mask.shape[-1]
        x2 = x.reshape(-1, K)
        M = x2.shape[0]
        out = out if out is not None else x.new_empty(*x.shape[:-1], N)
        if M == 0:
            return out
        plan = _plan_for(mask, plan)
        cfg = config if config is not None else tg.for_element_size(tg.default_k_config(M, N, K, K // ng),
                                                                     x.element_size())
        if config is None and cfg.variant == "premask" and M >= tg.K_SORTED_MIN_M and not _capturing(x):
            # structured masks: the pattern-sorted tiles may need few enough groups to beat the dense path (one
            # host read per plan, prefill only; under capture the dense path stays). No tile needs fewer pairs
            # than its tokens run, so a denser mask never qualifies and is not even sorted.
            sorted_cfg = tg.sorted_k_config(M, N, K, K // ng)
            sorted_cfg = sorted_cfg and tg.for_element_size(sorted_cfg, x.element_size())
            if sorted_cfg is not None and plan.expected_density() <= tg.K_SORTED_MAX_SHARE and \
                    plan.tile_share(sorted_cfg.block_m) <= tg.K_SORTED_MAX_SHARE:
                cfg = sorted_cfg
        if config is None and cfg.variant in ("list", "local") and plan.density_hint is not None and \
                not plan.built("groups"):
            # the share of groups some row of the call needs: the rate itself when the rows share one mask
            # (batch-coherent decode), else that of independent rows (at 50%, 16 rows need ~all groups)
            need = plan.density_hint if plan.rows_shared else 1.0 - (1.0 - plan.density_hint) ** M
            if need >= tg.K_LIST_MAX_HINT:
                # (nearly) every group: a list would skip nothing (and the plan's costs a launch)
                cfg = tg.for_element_size(tg.affine_k_config(M, N, K, K // ng), x.element_size())
        mask2 = mask.reshape(-1, ng).view(torch.uint8)
        if cfg.variant == "sorted":
            rows, tile_list, tile_count = plan.tile_order(cfg.block_m)
            tg.gemm_k_sorted(x2, weight, bias, out.view(-1, N), mask2, rows, tile_list, tile_count, K // ng, cfg,
                             x_masked=x_masked)
            return out
        if cfg.variant == "premask" and not x_masked and not _capturing(x):
            # an all-true mask makes the masking pass a copy: skip it (one host sync per plan, prefill only)
            x_masked = plan.known_all_active()
        glist = nlist = None  # "local" builds its tiles' lists in the kernel; the others read none
        if cfg.variant == "list":
            glist, nlist = plan.group_list()
        tg.gemm_k(x2, weight, bias, out.view(-1, N), mask2, glist, nlist, K // ng, cfg, x_masked=x_masked)
        return out

    def attention_prefill(self, q, k, v, mask, *, causal=True, scale=None, lengths=None, q_offset=None, plan=None,
                          out=None, config=None):
        from ..triton import attention as ta

        B, T, HQ, D = q.shape
        out = out if out is not None else torch.empty_like(q)
        if B == 0 or T == 0:
            return out
        scale = scale if scale is not None else ta.default_scale(D)
        gsize = HQ // mask.shape[-1]
        plan = _plan_for(mask, plan)
        if config is None and lengths is None and q_offset is None and k.shape[1] == T and T >= ta.PREFILL_DENSE_MIN_T:
            # dense masks (0% routing, say): SDPA beats the routed kernel; the choice reads the plan's hint
            # (no host read, capture-safe) or, eagerly, its measured density (shared with q_proj's plan)
            if (plan.density_hint is not None or not _capturing(q)) and \
                    plan.expected_density() >= ta.PREFILL_DENSE_DENSITY:
                all_active = not _capturing(q) and plan.known_all_active()
                return ta.attention_prefill_dense(q, k, v, out, mask, gsize, causal, scale, all_active)
        perm, counts = plan.token_order(flat=False)
        cfg = config if config is not None else ta.default_prefill_config(T, D, q.element_size())
        lens = lengths.to(torch.int32) if lengths is not None else None
        offs = q_offset.to(torch.int32) if q_offset is not None else None
        return ta.attention_prefill(q, k, v, out, perm, counts, lens, gsize, causal, scale, cfg, q_offset=offs)

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

    def coherent_route(self, x, down, up, bias, ema, selection, step, *, keep, memory=0.0, refresh_every=1,
                       keep_scale=1.0, groups=None, normalize=True, eps=1e-6):
        from ..triton import router as tr

        x2 = x.reshape(x.shape[0], x.shape[-1])
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        return tr.coherent_route(x2, down, up, bias, normalize, eps, ema, selection, step, keep, memory, refresh_every,
                                 keep_scale, groups)

    def router_margin(self, x, down, up, bias, *, normalize=True, eps=1e-6, decide=True):
        from ..triton import router as tr

        x2 = x.reshape(-1, x.shape[-1])
        if x2.shape[0] > tr.KERNEL_MAX_ROWS:
            out = _router_margin_rows(x2, down, up, bias, normalize, eps, decide)
        else:
            if x2.stride(-1) != 1:
                x2 = x2.contiguous()
            out = tr.router_margin(x2, down, up, bias, normalize, eps, decide)
        return out.view(*x.shape[:-1], out.shape[-1])

    def coherent_select(self, margin, ema, selection, step, *, keep, memory=0.0, refresh_every=1, keep_scale=1.0,
                        groups=None):
        from ..triton import router as tr

        return tr.coherent_select(margin, ema, selection, step, keep, memory, refresh_every, keep_scale, groups)

    takes_density = True

    def attention_decode(self, q, k, v, mask, *, lengths=None, scale=None, out=None, config=None, density=None):
        from ..triton import attention as ta

        B, _, HQ, D = q.shape
        out = out if out is not None else torch.empty_like(q)
        if B == 0:
            return out
        S, HK = k.shape[1], k.shape[2]
        cfg = config if config is not None else ta.default_decode_config(B, HK, S, D, q.device, density)
        scale = scale if scale is not None else ta.default_scale(D)
        mask2 = mask.reshape(B, -1).view(torch.uint8)
        lens = lengths.to(torch.int32) if lengths is not None else None
        return ta.attention_decode(q, k, v, out, mask2, lens, HQ // mask.shape[-1], scale, cfg)
