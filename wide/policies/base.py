"""Granularity policies: which routers a layer gets, how big their groups are, and how logits become masks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from wide.config import WideConfig


@dataclass(frozen=True)
class LayerShape:
    """The shapes of one decoder layer that routing depends on."""

    layer_idx: int
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int

    @property
    def gqa_ratio(self) -> int:
        return self.num_heads // self.num_kv_heads


@dataclass(frozen=True)
class RouterSlot:
    """One router a policy asks for.

    Attributes:
        kind: ``attn``, ``ffn`` or ``layer`` (one decision gating both sub-layers).
        num_groups: Number of groups G the router decides on.
        group_size: Query heads (``attn``) or channels (``ffn``) per group; for ``layer`` 0.
    """

    kind: str
    num_groups: int
    group_size: int


class Policy:
    """Base class: maps a layer's shape and the config to router slots, and logits to masks."""

    registered_name: str = ""

    def slots(self, shape: LayerShape, cfg: "WideConfig") -> list[RouterSlot]:
        raise NotImplementedError

    def validate(self, shape: LayerShape, cfg: "WideConfig") -> None:
        """Raises ``ValueError`` naming the config field when the model cannot be routed this way."""

    @staticmethod
    def decide(logits: torch.Tensor, *, tau: float, training: bool, deterministic: bool = False,
               noise: torch.Tensor | None = None) -> torch.Tensor:
        """Turns logits ``[B, T, G, 2]`` into an execute mask ``[B, T, G]`` (float, 1 = execute).

        Training: hard Gumbel-softmax with a straight-through estimator (forward exactly 0/1, gradient
        through the soft sample at temperature ``tau``), with the Gumbel ``noise`` given (shaped like
        ``logits``) or drawn here. Eval, or a deterministic router: argmax, ties execute, no gradient.
        """
        if training and not deterministic:
            if noise is None:
                return F.gumbel_softmax(logits.float(), tau=tau, hard=True, dim=-1)[..., 0]
            soft = ((logits.float() + noise) / tau).softmax(-1)[..., 0]
            hard = (soft >= 0.5).to(soft.dtype)  # argmax of two, ties execute (as gumbel_softmax's first index)
            return hard - soft.detach() + soft
        return (logits[..., 0] >= logits[..., 1]).float()
