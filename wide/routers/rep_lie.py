"""REP-LIE-style static pruning: groups removed during LoRA fine-tuning by an importance read from LoRA's gradients.

The router holds the pruning decision (``keep``, the same for every token) and the importance statistics;
`wide.callbacks.RepLiePruning` feeds it the importance after every optimizer step and prunes on its schedule.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from wide.routers.base import Router, RouterSpec
from wide.routers.registry import register_router


def lora_column_taylor(weight: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, grad_a: torch.Tensor,
                       grad_b: torch.Tensor, scaling: float) -> torch.Tensor:
    """``[K]``: for every input column ``c`` of a LoRA-adapted linear, ``sum_i (Ĝ ⊙ W_eff)[i, c]``.

    Derivation. peft's LoRA computes ``y = W x + s B (A x)`` (``W [N, K]`` frozen, ``A [r, K]``, ``B [N, r]``,
    ``s = alpha / r``), i.e. a linear map with the effective weight ``W_eff = W + s B A``. With
    ``G = dL/dW_eff = sum_t dL/dy_t x_tᵀ`` (never formed: ``W`` takes no gradient), autograd gives
    ``grad_B = s G Aᵀ`` and ``grad_A = s Bᵀ G``. A gradient step on the factors moves the effective weight by
    ``dW_eff = s (dB A + B dA) = -lr * s (grad_B A + B grad_A)``, so ``Ĝ = s (grad_B A + B grad_A)
    = s² (G AᵀA + B Bᵀ G)`` is the gradient of ``W_eff`` as LoRA can follow it: ``G`` projected on the LoRA
    tangent space (the row space of ``A`` and the column space of ``B``). Zeroing input column ``c`` (what a
    skipped head group does to ``o_proj``, a skipped channel group to ``down_proj``) changes the loss by
    ``-sum_i G[i, c] W_eff[i, c]`` to first order (Taylor); with ``Ĝ`` for ``G``, that is this function's value
    up to the sign. Per column, with no ``[N, K]`` product formed besides ``W`` itself::

        sum_i Ĝ[i, c] W_eff[i, c] = s * sum_k ( A[k, c] (grad_Bᵀ W_eff)[k, c] + grad_A[k, c] (Bᵀ W_eff)[k, c] )
        grad_Bᵀ W_eff = grad_Bᵀ W + s (grad_Bᵀ B) A,     Bᵀ W_eff = Bᵀ W + s (Bᵀ B) A        (both [r, K])

    Args:
        weight: ``[N, K]`` the frozen base weight (any float dtype; computed in float32).
        lora_a, lora_b: ``[r, K]`` and ``[N, r]`` LoRA factors.
        grad_a, grad_b: Their gradients, same shapes.
        scaling: peft's ``scaling`` (``alpha / r``).
    """
    w = weight.float()
    a, b, ga, gb = (t.float() for t in (lora_a, lora_b, grad_a, grad_b))
    gbt_w = gb.t() @ w + scaling * (gb.t() @ b) @ a  # [r, K]
    bt_w = b.t() @ w + scaling * (b.t() @ b) @ a  # [r, K]
    return scaling * ((a * gbt_w).sum(0) + (ga * bt_w).sum(0))


@register_router("rep_lie")
class RepLieRouter(Router):
    """Static structured pruning decided during LoRA fine-tuning: one keep / prune decision per group, the same
    for every token (no input is read).

    ``keep [G]`` (1 runs, 0 pruned; a parameter that never takes a gradient, so trained-tensor checkpoints carry
    it) starts at all ones; `wide.callbacks.RepLiePruning` lowers groups to 0, never back. The importance of a
    group at an optimizer step is ``|sum over its columns of Ĝ ⊙ W_eff|`` (`lora_column_taylor`), its running
    statistics an exponential moving mean and variance (:meth:`observe`), and groups are pruned lowest
    :meth:`stability` first. Without the callback nothing is pruned (dense).

    Args:
        spec: The router's spec.
        margin: Logit magnitude of the hard decision.
    """

    deterministic = True

    def __init__(self, spec: RouterSpec, margin: float = 1e4):
        super().__init__(spec)
        g = spec.num_groups
        self.margin = margin
        self.keep = nn.Parameter(torch.ones(g), requires_grad=False)
        # importance statistics: in Lightning's resume checkpoints (router buffers), not in the exported files
        self.register_buffer("imp_mean", torch.zeros(g))
        self.register_buffer("imp_var", torch.zeros(g))
        self.register_buffer("updates", torch.zeros((), dtype=torch.int64))
        self._rate_key: tuple = ()
        self._rate = 0.0

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        sign = (self.keep > 0.5).float() * 2 - 1  # [G]
        logits = torch.stack([sign, -sign], dim=-1) * self.margin
        return logits.to(hidden.device).expand(*hidden.shape[:-1], self.num_groups, 2)

    def execute_decision(self, hidden: torch.Tensor, backend: str = "torch", margin: bool = False) -> torch.Tensor:
        run = (self.keep > 0.5).expand(*hidden.shape[:-1], self.num_groups)
        return (run.float() * 2 - 1) * (2 * self.margin) if margin else run

    def expected_sparsity(self) -> float:
        # read once per change of ``keep`` (a pruning step, a checkpoint load), not per forward
        key = (self.keep.data_ptr(), self.keep._version, self.keep.device)
        if key != self._rate_key:
            self._rate = float((self.keep <= 0.5).float().mean())
            self._rate_key = key
        return self._rate

    @torch.no_grad()
    def observe(self, importance: torch.Tensor, beta: float) -> None:
        """Folds one step's ``importance [G]`` into the moving mean and variance (decay ``beta``); the first
        observation sets the mean (variance 0)."""
        x = importance.detach().to(self.imp_mean.device, torch.float32)
        first = self.updates == 0
        delta = x - self.imp_mean
        mean = torch.where(first, x, self.imp_mean + (1.0 - beta) * delta)
        var = torch.where(first, torch.zeros_like(x), beta * (self.imp_var + (1.0 - beta) * delta * delta))
        self.imp_mean.copy_(mean)
        self.imp_var.copy_(var)
        self.updates.add_(1)

    def stability(self, penalty: float) -> torch.Tensor:
        """``[G]`` score, lowest pruned first: moving mean minus ``penalty`` times the moving standard deviation
        (positive ``penalty``: a group must be important *consistently* to stay)."""
        return self.imp_mean - penalty * self.imp_var.clamp_min(0).sqrt()

    @property
    def pruned(self) -> torch.Tensor:
        """``[G]`` bool, the pruned groups."""
        return self.keep.detach() <= 0.5

    @torch.no_grad()
    def prune(self, groups: torch.Tensor) -> None:
        """Prunes ``groups`` (indices) for good."""
        self.keep[groups.to(self.keep.device)] = 0.0

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, pruned={int(self.pruned.sum())}"


def routers_of(model: nn.Module) -> list[tuple[object, str, RepLieRouter]]:
    """``(WideLayer, slot kind, router)`` for every `RepLieRouter` of a routed model, in layer order."""
    from wide.modeling.wrap import runtime_of

    out = []
    for wl in runtime_of(model).layers:
        for kind, router in wl.routers.items():
            if isinstance(router, RepLieRouter):
                out.append((wl, kind, router))
    return out


def importance_of(weight_grads: list[tuple[torch.Tensor, ...]], num_groups: int) -> Optional[torch.Tensor]:
    """``[G]`` importance of a slot: ``|sum over each gated sub-layer's columns of the group|`` of
    `lora_column_taylor` terms; ``weight_grads`` holds one ``(W, A, B, grad_A, grad_B, scaling)`` per gated
    sub-layer's output projection. ``None`` before the LoRA factors have gradients."""
    total = None
    for weight, a, b, ga, gb, s in weight_grads:
        if ga is None or gb is None:
            return None
        cols = lora_column_taylor(weight, a, b, ga, gb, s)
        per_group = cols.view(num_groups, -1).sum(-1)
        total = per_group if total is None else total + per_group
    return None if total is None else total.abs()
