"""Per-token sub-layer skipping (SkipGPT / router-tuning style dynamic depth)."""

from __future__ import annotations

from wide.policies.base import LayerShape, Policy, RouterSlot
from wide.policies.registry import register_policy


@register_policy("sublayer")
class SublayerPolicy(Policy):
    """One per-token decision for the whole attention (all query heads) and one for the whole FFN.

    K/V projections still run for skipped tokens, so later tokens can attend to them.
    Group sizes in the config are ignored.
    """

    def slots(self, shape: LayerShape, cfg) -> list[RouterSlot]:
        out = []
        if cfg.targets in ("all", "attention"):
            out.append(RouterSlot("attn", 1, shape.num_heads))
        if cfg.targets in ("all", "ffn"):
            out.append(RouterSlot("ffn", 1, shape.intermediate_size))
        return out
