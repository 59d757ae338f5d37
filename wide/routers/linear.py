"""A single linear map from the residual stream to per-group logits."""

from __future__ import annotations

import torch
from torch import nn

from wide.routers.base import Router, RouterSpec, rms_normalize, split_logits
from wide.routers.registry import register_router


@register_router("linear")
class LinearRouter(Router):
    """``Linear(D -> 2G)`` over the (RMS-normalised) pre-norm residual."""

    def __init__(self, spec: RouterSpec, normalize: bool = True):
        super().__init__(spec)
        self.normalize = normalize
        self.proj = nn.Linear(spec.hidden_size, 2 * spec.num_groups)
        nn.init.zeros_(self.proj.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        x = rms_normalize(hidden) if self.normalize else hidden
        return split_logits(self.proj(x.to(self.proj.weight.dtype)), self.num_groups)
