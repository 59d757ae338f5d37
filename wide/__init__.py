"""wide: token-level dynamic width pruning (WIDE) for Hugging Face causal LMs, on PyTorch Lightning.

The public names below are imported on first use (PEP 562), so that ``import wide`` (and the ``wide``
command, whose subcommands each import only what they run) does not pay for torch, Lightning and
transformers up front.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> the module defining it
_EXPORTS: dict[str, str] = {
    "WideConfig": "wide.config",
    "export": "wide.io",
    "load": "wide.io",
    "ARCHITECTURES": "wide.modeling",
    "SparsityStats": "wide.modeling",
    "apply_wide": "wide.modeling",
    "is_routed": "wide.modeling",
    "router_parameters": "wide.modeling",
    "set_temperature": "wide.modeling",
    "sparsity_stats": "wide.modeling",
    "fuse_glue": "wide.modeling.fuse",
    "unfuse_glue": "wide.modeling.fuse",
    "Generator": "wide.modeling.generate",
    "generate": "wide.modeling.generate",
    "enable_kernels": "wide.modeling.inference",
    "set_coherent_decode": "wide.modeling.inference",
    "set_overlap_routing": "wide.modeling.inference",
    "set_weight_layout": "wide.modeling.layout",
    "POLICIES": "wide.policies",
    "Policy": "wide.policies",
    "register_policy": "wide.policies",
    "ROUTERS": "wide.routers",
    "Router": "wide.routers",
    "RouterSpec": "wide.routers",
    "register_router": "wide.routers",
}

__all__ = [
    "ARCHITECTURES",
    "Generator",
    "POLICIES",
    "Policy",
    "ROUTERS",
    "Router",
    "RouterSpec",
    "SparsityStats",
    "WideConfig",
    "apply_wide",
    "enable_kernels",
    "export",
    "fuse_glue",
    "generate",
    "is_routed",
    "load",
    "register_policy",
    "register_router",
    "router_parameters",
    "set_coherent_decode",
    "set_overlap_routing",
    "set_temperature",
    "set_weight_layout",
    "sparsity_stats",
    "unfuse_glue",
]

if TYPE_CHECKING:  # static tools see the eager imports
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
    from wide.modeling.layout import set_weight_layout
    from wide.policies import POLICIES, Policy, register_policy
    from wide.routers import ROUTERS, Router, RouterSpec, register_router


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        if importlib.util.find_spec(f"wide.{name}") is None:
            raise AttributeError(f"module 'wide' has no attribute {name!r}")
        return importlib.import_module(f"wide.{name}")  # `import wide; wide.io.load_model` as before
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
