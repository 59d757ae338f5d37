"""In-place wrapping of Hugging Face causal LMs, driven by one per-architecture table."""

from wide.modeling.architectures import ARCHITECTURES, ArchSpec, arch_for
from wide.modeling.layer import WideLayer
from wide.modeling.rate import RateFit, fit_rate
from wide.modeling.runtime import SparsityStats, WideRuntime
from wide.modeling.wrap import (
    apply_wide,
    is_routed,
    layer_shapes,
    router_parameters,
    runtime_of,
    set_temperature,
    sparsity_stats,
)

__all__ = [
    "ARCHITECTURES",
    "ArchSpec",
    "RateFit",
    "SparsityStats",
    "WideLayer",
    "WideRuntime",
    "apply_wide",
    "arch_for",
    "fit_rate",
    "is_routed",
    "layer_shapes",
    "router_parameters",
    "runtime_of",
    "set_temperature",
    "sparsity_stats",
]
