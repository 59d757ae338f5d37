"""Granularity policies: ``width`` (WIDE), ``sublayer`` (SkipGPT-style), ``layer`` (MoD-style)."""

from wide.policies.base import LayerShape, Policy, RouterSlot
from wide.policies.registry import POLICIES, register_policy
from wide.policies.layer import LayerPolicy
from wide.policies.sublayer import SublayerPolicy
from wide.policies.width import WidthPolicy

__all__ = ["POLICIES", "LayerPolicy", "LayerShape", "Policy", "RouterSlot", "SublayerPolicy", "WidthPolicy", "register_policy"]
