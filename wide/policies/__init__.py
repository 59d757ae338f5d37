"""Granularity policies and the routing decision: ``width`` (WIDE), ``sublayer`` (SkipGPT-style), ``layer`` (MoD-style).

A policy says which routers a layer gets and what each one gates (`RouterSlot`), and turns a router's input
into its masks in training, eval and batch-coherent decode (`Policy.mask`; `CoherentDecode`).
"""

from wide.policies.base import SUBLAYERS, LayerShape, Policy, RouterSlot, argmax_mask, gumbel_ste
from wide.policies.coherent import CoherentDecode
from wide.policies.registry import POLICIES, register_policy
from wide.policies.layer import LayerPolicy
from wide.policies.sublayer import SublayerPolicy
from wide.policies.width import WidthPolicy

__all__ = [
    "POLICIES",
    "SUBLAYERS",
    "CoherentDecode",
    "LayerPolicy",
    "LayerShape",
    "Policy",
    "RouterSlot",
    "SublayerPolicy",
    "WidthPolicy",
    "argmax_mask",
    "gumbel_ste",
    "register_policy",
]
