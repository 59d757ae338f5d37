"""WIDE's granularity: GQA-aligned query-head groups and tile-aligned FFN channel groups."""

from __future__ import annotations

from wide.policies.base import LayerShape, Policy, RouterSlot
from wide.policies.registry import register_policy


def attn_group_size(shape: LayerShape, cfg) -> int:
    return shape.gqa_ratio if cfg.attn_group_size is None else cfg.attn_group_size


@register_policy("width")
class WidthPolicy(Policy):
    """Per token, one decision per query-head group and one per FFN channel group."""

    def validate(self, shape: LayerShape, cfg) -> None:
        g, hq, ratio = attn_group_size(shape, cfg), shape.num_heads, shape.gqa_ratio
        if cfg.targets in ("all", "attention"):
            if hq % g:
                raise ValueError(f"attn_group_size: {g} does not divide the {hq} query heads")
            if ratio % g and g % ratio:
                raise ValueError(
                    f"attn_group_size: {g} is not GQA-aligned: with {ratio} query heads per KV head it must divide "
                    f"{ratio} or be a multiple of it"
                )
        if cfg.targets in ("all", "ffn") and shape.intermediate_size % cfg.ffn_group_size:
            raise ValueError(
                f"ffn_group_size: {cfg.ffn_group_size} does not divide the FFN width {shape.intermediate_size}"
            )

    def slots(self, shape: LayerShape, cfg) -> list[RouterSlot]:
        out = []
        if cfg.targets in ("all", "attention"):
            g = attn_group_size(shape, cfg)
            out.append(RouterSlot("attn", shape.num_heads // g, g))
        if cfg.targets in ("all", "ffn"):
            out.append(RouterSlot("ffn", shape.intermediate_size // cfg.ffn_group_size, cfg.ffn_group_size))
        return out
