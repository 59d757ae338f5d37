"""Training-free top-k router: per token, keep the groups with the largest estimated output."""

from __future__ import annotations

import math

import torch

from wide.routers.base import Router, RouterSpec
from wide.routers.registry import register_router


@register_router("topk")
class TopKRouter(Router):
    """Ranks groups per token by ``|hidden| @ scoresᵀ`` and keeps exactly ``ceil((1 - s) * G)``.

    ``scores [G, D]`` comes from the policy (``spec.group_scores``): the L2 norm of each weight column
    restricted to the group's output rows, times the preceding RMSNorm gain — activation norm × weight
    column norm, a Wanda-style estimate of the group's output magnitude. The residual's RMS factor is
    shared by all groups of a token, so it does not change the ranking and is left out.

    Args:
        spec: The router's spec.
        sparsity: Skip rate to realise; ``None`` takes the spec's target.
        margin: Logit magnitude; large so that Gumbel noise cannot flip a decision.
    """

    deterministic = True

    def __init__(self, spec: RouterSpec, sparsity: float | None = None, margin: float = 1e4):
        super().__init__(spec)
        if spec.group_scores is None:
            raise ValueError(f"router: 'topk' needs weight-based group scores, which policy kind {spec.kind!r} lacks")
        s = spec.target_sparsity if sparsity is None else sparsity
        self.keep = max(1, min(spec.num_groups, math.ceil((1.0 - s) * spec.num_groups - 1e-9)))
        self.margin = margin
        self._scores_fn = spec.group_scores
        self.register_buffer("scores", torch.empty(0), persistent=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.scores.numel() == 0 or self.scores.device != hidden.device:
            self.scores = self._scores_fn().to(device=hidden.device, dtype=torch.float32)
        est = hidden.detach().float().abs() @ self.scores.t()  # [B, T, G]
        keep = torch.zeros_like(est, dtype=torch.bool)
        keep.scatter_(-1, est.topk(self.keep, dim=-1).indices, True)
        sign = keep.float() * 2 - 1
        return torch.stack([sign, -sign], dim=-1) * self.margin
