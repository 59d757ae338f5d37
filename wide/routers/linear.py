"""A single linear map from the residual stream to per-group logits."""

from __future__ import annotations

import torch
from torch import nn

from wide.kernels import router_margin
from wide.routers.base import FoldedMargin, Router, RouterSpec, rms_normalize, split_logits
from wide.routers.registry import register_router


@register_router("linear")
class LinearRouter(Router):
    """``Linear(D -> 2G)`` over the (RMS-normalised) pre-norm residual."""

    def __init__(self, spec: RouterSpec, normalize: bool = True):
        super().__init__(spec)
        self.normalize = normalize
        self._fold = FoldedMargin()
        self.proj = nn.Linear(spec.hidden_size, 2 * spec.num_groups)
        nn.init.zeros_(self.proj.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return split_logits(self.proj(self._input(hidden)), self.num_groups)

    def logit_bias(self) -> nn.Parameter:
        return self.proj.bias

    def execute_margin(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.execute_decision(hidden, margin=True)

    def execute_decision(self, hidden: torch.Tensor, backend: str = "torch", margin: bool = False) -> torch.Tensor:
        w, b = self._fold.weights(self.proj)
        return router_margin(hidden, w, None, b, normalize=self.normalize, decide=not margin, backend=backend)

    def margin_weights(self):
        w, b = self._fold.weights(self.proj)
        return (w, None, b, self.normalize)

    def _input(self, hidden: torch.Tensor) -> torch.Tensor:
        x = rms_normalize(hidden) if self.normalize else hidden
        return x.to(self.proj.weight.dtype)
