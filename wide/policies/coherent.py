"""Batch-coherent decode: every row of a decode step runs the same groups (a shared top-k of the rows' margins)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from wide.kernels import coherent_route, coherent_select

if TYPE_CHECKING:
    from wide.routers.base import Router


@dataclass
class CoherentDecode:
    """Batch-coherent decode routing: every row of a decode step runs the same groups.

    With independent per-token masks a weight group must be read when *any* row needs it, so GEMV
    savings vanish at batch > 1. In eval-mode decode steps (one new token per row) this replaces the
    per-token argmax by a shared top-k: each group's execute probability is averaged over the batch,
    folded into an exponential moving average (the activation memory, so groups that keep recurring
    stay selected), and the best groups are selected for all rows. How many: ``keep="router"`` (default)
    as many as the step's rows execute on average under their own decisions — the layer's learned rate,
    decided on the device; ``keep="target"`` the fixed ``ceil((1 - target) * G)`` of every layer. The
    selection is refreshed every ``refresh_every`` decode steps and kept in between. Prefill keeps
    per-token routing.

    Args:
        refresh_every: Decode steps between selections (1: every step).
        memory: EMA decay of the per-group score (0, the default: no memory — measured best at refresh 1,
            benchmarks/results/2026-11-30c-cpu-coherent-quality/README.md).
        keep: ``"router"`` or ``"target"`` (see above).
        keep_scale: With ``keep="router"``, keep this multiple of the rows' mean count (rounded half up, at
            most every group): above 1 a step reads more weights and drops fewer of the groups its rows want.
    """

    refresh_every: int = 1
    memory: float = 0.0
    keep: str = "router"
    keep_scale: float = 1.0

    def __post_init__(self) -> None:
        if not (isinstance(self.refresh_every, int) and self.refresh_every >= 1):
            raise ValueError(f"refresh_every: must be an integer >= 1, got {self.refresh_every!r}")
        if not 0.0 <= self.memory < 1.0:
            raise ValueError(f"memory: must be in [0, 1), got {self.memory!r}")
        if self.keep not in ("router", "target"):
            raise ValueError(f"keep: must be 'router' or 'target', got {self.keep!r}")
        if not (isinstance(self.keep_scale, (int, float)) and 0.0 < self.keep_scale <= 16.0):
            raise ValueError(f"keep_scale: must be in (0, 16], got {self.keep_scale!r}")
        if self.keep != "router" and self.keep_scale != 1.0:
            raise ValueError("keep_scale: scales keep='router' only")

    def mask(self, router: "Router", hidden: torch.Tensor, state: dict, backend: str = "torch") -> torch.Tensor:
        """The shared execute mask ``[B, 1, G]`` (bool) of ``router`` for a decode step's residual ``hidden [B, 1, D]``.

        ``state`` is the router's memory for the current sequence (a dict its layer keeps, empty at the first
        step). A router with ``margin_weights()`` on a fused backend, past the first step, routes the step in
        one launch (:meth:`route`); otherwise :meth:`select` of ``router.execute_decision(..., margin=True)``.
        """
        weights = router.margin_weights() if backend != "torch" else None
        target = router.expected_sparsity()
        if weights is not None and state.get("ema") is not None and state["ema"].shape == (router.num_groups,):
            return self.route(state, hidden, weights, target, backend=backend)
        margin = router.execute_decision(hidden, backend=backend, margin=True)
        return self.select(state, margin, target, backend=backend)

    def select(self, state: dict, margin: torch.Tensor, target: float, backend: str = "torch") -> torch.Tensor:
        """``margin [B, 1, G]`` (execute minus skip logit) -> the shared execute mask ``[B, 1, G]`` (bool).

        ``target`` is the router's expected skip rate; ``backend`` the kernel backend of routed inference
        (`wide.kernels.coherent_select`: one launch on triton, a few torch ops on the reference; no host
        sync either way).
        """
        b, _, g = margin.shape
        margin = margin.reshape(b, g)
        keep = max(1, min(g, math.ceil((1.0 - target) * g - 1e-9))) if self.keep == "target" else None
        if state.get("ema") is None or state["ema"].shape != (g,):
            # first decode step of a sequence: start the memory from this step and select now; the state
            # is updated in place afterwards, so a captured step keeps it on every replay
            state["ema"] = torch.sigmoid(margin.float()).mean(0)
            state["selection"] = torch.zeros(g, dtype=torch.bool, device=margin.device)
            state["step"] = torch.zeros((), dtype=torch.int64, device=margin.device)
            # the fused kernels' group list of the selection, written by the same launch (the plan of the shared
            # mask then builds none); the reference path has no use for it
            state["groups"] = None if backend == "torch" else (
                torch.empty(g, dtype=torch.int32, device=margin.device),
                torch.empty(1, dtype=torch.int32, device=margin.device))
        sel = coherent_select(margin, state["ema"], state["selection"], state["step"], keep=keep,
                              memory=self.memory, refresh_every=self.refresh_every,
                              keep_scale=self.keep_scale if keep is None else 1.0, groups=state.get("groups"),
                              backend=backend)
        return sel.expand(b, 1, g)

    def route(self, state: dict, hidden: torch.Tensor, weights: tuple, target: float, backend: str) -> torch.Tensor:
        """:meth:`select` of the margins `wide.kernels.router_margin` would give for ``weights`` (a router's
        ``margin_weights()``), from the decode step's residual ``hidden [B, 1, D]``, in one launch on triton
        (`wide.kernels.coherent_route`). The state must exist (the sequence's first step goes through
        :meth:`select`, which starts the memory from that step's margins)."""
        down, up, bias, normalize = weights
        b, g = hidden.shape[0], state["selection"].shape[0]
        keep = max(1, min(g, math.ceil((1.0 - target) * g - 1e-9))) if self.keep == "target" else None
        sel = coherent_route(hidden, down, up, bias, ema=state["ema"], selection=state["selection"],
                             step=state["step"], keep=keep, memory=self.memory, refresh_every=self.refresh_every,
                             keep_scale=self.keep_scale if keep is None else 1.0, groups=state.get("groups"),
                             normalize=normalize, backend=backend)
        return sel.expand(b, 1, g)


def selection_groups(states, mask: torch.Tensor):
    """The group list (fused backends) that batch-coherent decode wrote with the selection ``mask`` is a view of,
    looked up in the routers' decode ``states``; ``None`` when ``mask`` is no such view (its plan then builds one)."""
    for state in states:
        sel, groups = state.get("selection"), state.get("groups")
        if groups is not None and sel is not None and mask.shape[-1] == sel.shape[0] and \
                mask.data_ptr() == sel.data_ptr():
            return groups
    return None


def restart_schedule(state: dict) -> None:
    """A new sequence over a captured decode step: the selection's refresh schedule starts again, in place."""
    if state.get("step") is not None:
        state["step"].zero_()
