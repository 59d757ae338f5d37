"""wide: token-level dynamic width pruning (WIDE) for Hugging Face causal LMs, on PyTorch Lightning."""

from wide.config import WideConfig
from wide.io import export, load
from wide.modeling import (
    ARCHITECTURES,
    SparsityStats,
    apply_wide,
    is_routed,
    router_parameters,
    set_temperature,
    sparsity_stats,
)
from wide.modeling.fuse import fuse_glue, unfuse_glue
from wide.modeling.generate import Generator, generate
from wide.modeling.inference import enable_kernels, set_coherent_decode, set_overlap_routing
from wide.policies import POLICIES, Policy, register_policy
from wide.routers import ROUTERS, Router, RouterSpec, register_router

__version__ = "0.1.0"

__all__ = [
    "ARCHITECTURES",
    "POLICIES",
    "ROUTERS",
    "Policy",
    "Router",
    "RouterSpec",
    "SparsityStats",
    "WideConfig",
    "apply_wide",
    "enable_kernels",
    "export",
    "fuse_glue",
    "Generator",
    "generate",
    "load",
    "set_coherent_decode",
    "set_overlap_routing",
    "is_routed",
    "register_policy",
    "register_router",
    "router_parameters",
    "set_temperature",
    "sparsity_stats",
    "unfuse_glue",
]
