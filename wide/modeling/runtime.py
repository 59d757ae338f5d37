"""Per-model routing state: temperature, valid-token mask and realized-sparsity accounting.

Everything stays on the device: one forward records a handful of small tensors per routed layer and
nothing calls ``.item()``; loggers read them once per log step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

KINDS = ("attn", "ffn")


@dataclass
class SparsityStats:
    """Realized routing of the last forward.

    Attributes:
        layers: Indices of the routed decoder layers, in order.
        skip: Per kind, ``[L]`` skipped fraction of (valid token, group) units per routed layer (detached).
        skip_grad: Per kind, the same rates as differentiable tensors (straight-through in training).
        token_active: Per kind, ``[B, T, L]`` active fraction of each token's groups per routed layer.
        valid: ``[B, T]`` bool, the tokens that count (``None``: all).
    """

    layers: list[int]
    skip: dict[str, torch.Tensor]
    skip_grad: dict[str, torch.Tensor]
    token_active: dict[str, torch.Tensor]
    valid: Optional[torch.Tensor]

    @property
    def kinds(self) -> list[str]:
        return list(self.skip)

    def realized(self, kind: Optional[str] = None, differentiable: bool = False) -> torch.Tensor:
        """Mean skip rate over routed layers for one kind, or averaged over kinds when ``kind`` is None."""
        src = self.skip_grad if differentiable else self.skip
        if kind is not None:
            return src[kind].mean()
        return torch.stack([src[k].mean() for k in src]).mean()

    def token_active_mean(self) -> torch.Tensor:
        """``[B, T]`` active fraction per token, averaged over routed layers and kinds."""
        return torch.stack([t.mean(-1) for t in self.token_active.values()]).mean(0)


@dataclass
class WideRuntime:
    """Mutable routing state shared by all routed layers of one model."""

    tau: float = 1.0
    valid: Optional[torch.Tensor] = None
    layers: list = field(default_factory=list)
    _records: dict = field(default_factory=dict)

    def begin_forward(self, valid: Optional[torch.Tensor]) -> None:
        self.valid = valid
        self._records = {}

    def record(self, layer_idx: int, kind: str, mask: torch.Tensor) -> None:
        """Accounts one execute mask ``[B, T, G]`` (float, may carry straight-through gradient)."""
        skipped = 1.0 - mask
        if self.valid is not None and self.valid.shape == mask.shape[:2]:
            w = self.valid.to(mask.dtype).unsqueeze(-1)
            rate = (skipped * w).sum() / (w.sum() * mask.shape[-1]).clamp_min(1.0)
        else:
            rate = skipped.mean()
        self._records[(layer_idx, kind)] = (rate, mask.detach().mean(-1))

    def stats(self) -> Optional[SparsityStats]:
        if not self._records:
            return None
        layers = sorted({i for i, _ in self._records})
        skip, skip_grad, active = {}, {}, {}
        for kind in KINDS:
            recs = [self._records.get((i, kind)) for i in layers]
            if any(r is None for r in recs):
                continue
            skip_grad[kind] = torch.stack([r[0] for r in recs])
            skip[kind] = skip_grad[kind].detach()
            active[kind] = torch.stack([r[1] for r in recs], dim=-1)
        return SparsityStats(layers, skip, skip_grad, active, self.valid)
