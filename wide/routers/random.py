"""Random routing at a fixed rate: synthetic masks for benchmarks and a no-information baseline."""

from __future__ import annotations

from typing import Optional

import torch

from wide.routers.base import Router, RouterSpec
from wide.routers.registry import register_router


@register_router("random")
class RandomRouter(Router):
    """Each (token, group) executes independently with probability ``1 - sparsity``; no parameters.

    Args:
        spec: The router's spec.
        sparsity: Skip probability; ``None`` takes the spec's target.
        seed: Seed of a private generator (``None``: the global RNG).
    """

    deterministic = True

    def __init__(self, spec: RouterSpec, sparsity: Optional[float] = None, seed: Optional[int] = None):
        super().__init__(spec)
        self.rate = spec.target_sparsity if sparsity is None else sparsity
        self.seed = seed
        self._gen: Optional[torch.Generator] = None

    def expected_sparsity(self) -> float:
        return float(self.rate)

    @torch.compiler.disable  # a seeded draw of a data-dependent shape: eager under torch.compile
    def _uniform(self, hidden: torch.Tensor) -> torch.Tensor:
        gen = None
        if self.seed is not None:
            if self._gen is None or self._gen.device != hidden.device:
                self._gen = torch.Generator(device=hidden.device).manual_seed(self.seed + self.spec.layer_idx)
            gen = self._gen
        return torch.rand(*hidden.shape[:-1], self.num_groups, device=hidden.device, generator=gen)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        sign = (self._uniform(hidden) >= self.rate).float() * 2 - 1
        return torch.stack([sign, -sign], dim=-1)

    def execute_margin(self, hidden: torch.Tensor) -> torch.Tensor:
        # the same draw and decision as forward() in two launches instead of seven: benchmarks time the
        # routed layer, not the synthetic mask source
        return self._uniform(hidden) - self.rate

    def execute_decision(self, hidden: torch.Tensor, backend: str = "torch", margin: bool = False) -> torch.Tensor:
        u = self._uniform(hidden)
        return u - self.rate if margin else u >= self.rate
