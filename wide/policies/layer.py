"""Per-token whole-layer skipping (MoD / D-LLM / AdaDSF style dynamic depth)."""

from __future__ import annotations

from wide.policies.base import LayerShape, Policy, RouterSlot
from wide.policies.registry import register_policy


@register_policy("layer")
class LayerPolicy(Policy):
    """One per-token decision, read from the layer input, gating attention and FFN together.

    K/V projections still run for skipped tokens (the KV cache stays complete, unlike D-LLM).
    """

    def validate(self, shape: LayerShape, cfg) -> None:
        if cfg.targets != "all":
            raise ValueError(f"targets: the 'layer' policy gates whole layers and needs targets='all', got {cfg.targets!r}")

    def slots(self, shape: LayerShape, cfg) -> list[RouterSlot]:
        return [RouterSlot("layer", 1, 0, gates=("attn", "ffn"))]
