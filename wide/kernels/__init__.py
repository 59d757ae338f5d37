"""Routed execution kernels for WIDE: functional ops, a reusable routing plan, pluggable backends.

Ops: `gemm_mn`, `swiglu`, `gemm_k`, `ffn_experts` (the routed SwiGLU FFN; wide groups run as experts),
`attention_prefill`, `attention_decode`, `make_plan`, and the routing ops `router_margin` / `coherent_select` /
`coherent_route` (the two in one launch), `rms_norm_route` (a layer's RMSNorm with its router's decisions), and
`decode_qkv` (a decode step's routed q, k / v, RoPE and static-cache write), `gemm_k_route` (a decode step's
`gemm_k` with its residual add and the next norm and router).
Backends: ``torch`` (reference, autograd), ``gather`` (naive baseline), ``triton`` (fused kernels), and any
registered with `register_backend`; ``backend="auto"`` or ``WIDE_KERNEL_BACKEND`` picks per call (see
`wide.kernels.dispatch`). `KernelOptions` / `use_kernel_options` switch the fused kernels' default configs for A/Bs.
Importing this package never imports Triton.
"""

from .backends import (KernelBackend, available_backends, backend_choices, get_backend, list_backends,
                       register_backend, unregister_backend)
from .ops import attention_decode, attention_prefill, decode_qkv, ffn_experts, gemm_k, gemm_mn, swiglu
from .route_ops import coherent_route, coherent_select, gemm_k_route, rms_norm_route, router_margin
from .options import KernelOptions, kernel_options, use_kernel_options
from .plan import RoutingPlan, make_plan

__all__ = [
    "KernelBackend",
    "KernelOptions",
    "RoutingPlan",
    "attention_decode",
    "attention_prefill",
    "available_backends",
    "backend_choices",
    "coherent_route",
    "coherent_select",
    "decode_qkv",
    "ffn_experts",
    "gemm_k",
    "gemm_k_route",
    "gemm_mn",
    "get_backend",
    "kernel_options",
    "list_backends",
    "make_plan",
    "register_backend",
    "rms_norm_route",
    "router_margin",
    "swiglu",
    "unregister_backend",
    "use_kernel_options",
]
