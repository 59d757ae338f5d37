"""Routed execution kernels for WIDE: functional ops, a reusable routing plan, pluggable backends.

Ops: `gemm_mn`, `swiglu`, `gemm_k`, `attention_prefill`, `attention_decode`, `make_plan`, and the routing
ops `router_margin` / `coherent_select` / `coherent_route` (the two in one launch).
Backends: ``torch`` (reference, autograd), ``gather`` (naive baseline), ``triton`` (fused kernels);
``backend="auto"`` or ``WIDE_KERNEL_BACKEND`` picks per call (see `wide.kernels.dispatch`).
Importing this package never imports Triton.
"""

from .backends import KernelBackend, available_backends, get_backend, list_backends, register_backend
from .ops import (attention_decode, attention_prefill, coherent_route, coherent_select, gemm_k, gemm_mn,
                  router_margin, swiglu)
from .plan import RoutingPlan, make_plan

__all__ = [
    "KernelBackend",
    "RoutingPlan",
    "attention_decode",
    "attention_prefill",
    "available_backends",
    "coherent_route",
    "coherent_select",
    "gemm_k",
    "gemm_mn",
    "get_backend",
    "list_backends",
    "make_plan",
    "register_backend",
    "router_margin",
    "swiglu",
]
