"""A two-layer MLP router."""

from __future__ import annotations

import torch
from torch import nn

from wide.routers.base import Router, RouterSpec, rms_normalize, split_logits
from wide.routers.registry import register_router


@register_router("mlp")
class MLPRouter(Router):
    """``Linear(D -> h)``, GELU, ``Linear(h -> 2G)``; ``h`` defaults to 4x ``WideConfig.router_rank``."""

    def __init__(self, spec: RouterSpec, hidden: int | None = None, normalize: bool = True):
        super().__init__(spec)
        width = 4 * spec.rank if hidden is None else hidden
        self.normalize = normalize
        self.net = nn.Sequential(nn.Linear(spec.hidden_size, width), nn.GELU(), nn.Linear(width, 2 * spec.num_groups))
        nn.init.zeros_(self.net[2].bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        x = rms_normalize(hidden) if self.normalize else hidden
        return split_logits(self.net(x.to(self.net[0].weight.dtype)), self.num_groups)

    def logit_bias(self) -> nn.Parameter:
        return self.net[2].bias
