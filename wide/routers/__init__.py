"""Routers: per-layer modules mapping the pre-norm residual ``[B, T, D]`` to logits ``[B, T, G, 2]``."""

from wide.routers.base import Router, RouterSpec, rms_normalize
from wide.routers.registry import ROUTERS, register_router
from wide.routers.batched_topk import BatchedTopKRouter
from wide.routers.linear import LinearRouter
from wide.routers.lowrank import LowRankRouter
from wide.routers.mlp import MLPRouter
from wide.routers.random import RandomRouter
from wide.routers.rep_lie import RepLieRouter
from wide.routers.static import StaticRouter
from wide.routers.topk import TopKRouter

__all__ = [
    "ROUTERS",
    "BatchedTopKRouter",
    "LinearRouter",
    "LowRankRouter",
    "MLPRouter",
    "RandomRouter",
    "RepLieRouter",
    "Router",
    "RouterSpec",
    "StaticRouter",
    "TopKRouter",
    "register_router",
    "rms_normalize",
]
