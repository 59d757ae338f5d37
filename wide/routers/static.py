"""Input-agnostic learnable logits per group: the static structured width-pruning baseline."""

from __future__ import annotations

import torch
from torch import nn

from wide.routers.base import Router, RouterSpec
from wide.routers.registry import register_router


@register_router("static")
class StaticRouter(Router):
    """One learnable (execute, skip) logit pair per group, the same for every token.

    Trained with the same Gumbel/STE decisions and sparsity loss as the dynamic routers; in eval the
    argmax keeps the same groups for all tokens, which is static structured width pruning.
    """

    def __init__(self, spec: RouterSpec, init_std: float = 0.01):
        super().__init__(spec)
        self.logits = nn.Parameter(torch.randn(spec.num_groups, 2) * init_std)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.logits.expand(*hidden.shape[:-1], self.num_groups, 2)

    def logit_bias(self) -> nn.Parameter:
        return self.logits
