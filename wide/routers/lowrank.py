"""WIDE's router: a low-rank bottleneck over the pre-norm residual stream."""

from __future__ import annotations

import math

import torch
from torch import nn

from wide.kernels import router_margin
from wide.routers.base import FoldedMargin, Router, RouterSpec, rms_normalize, split_logits
from wide.routers.registry import register_router


@register_router("lowrank")
class LowRankRouter(Router):
    """``Linear(D -> r)`` then ``Linear(r -> 2G)``, Kaiming init, zero bias (as in the paper).

    Args:
        spec: The router's spec.
        rank: Bottleneck width; ``None`` takes ``spec.rank`` (``WideConfig.router_rank``).
        normalize: RMS-normalise the input first (parameter-free).
        execute_bias: Initial bias of the execute logit minus the skip logit; 0 starts at 50% skip.
    """

    def __init__(self, spec: RouterSpec, rank: int | None = None, normalize: bool = True, execute_bias: float = 0.0):
        super().__init__(spec)
        self._fold = FoldedMargin()
        rank = spec.rank if rank is None else rank
        self.normalize = normalize
        self.down = nn.Linear(spec.hidden_size, rank, bias=False)
        self.up = nn.Linear(rank, 2 * spec.num_groups)
        nn.init.kaiming_uniform_(self.down.weight, a=math.sqrt(5))
        nn.init.kaiming_uniform_(self.up.weight, a=math.sqrt(5))
        with torch.no_grad():
            self.up.bias.zero_()
            self.up.bias[0::2] = execute_bias / 2
            self.up.bias[1::2] = -execute_bias / 2

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return split_logits(self.up(self.down(self._input(hidden))), self.num_groups)

    def logit_bias(self) -> nn.Parameter:
        return self.up.bias

    def execute_margin(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.execute_decision(hidden, margin=True)

    def execute_decision(self, hidden: torch.Tensor, backend: str = "torch", margin: bool = False) -> torch.Tensor:
        return router_margin(hidden, self.down.weight, *self._fold.weights(self.up), normalize=self.normalize,
                             decide=not margin, backend=backend)

    def margin_weights(self):
        return (self.down.weight, *self._fold.weights(self.up), self.normalize)

    def _input(self, hidden: torch.Tensor) -> torch.Tensor:
        x = rms_normalize(hidden) if self.normalize else hidden
        return x.to(self.down.weight.dtype)
