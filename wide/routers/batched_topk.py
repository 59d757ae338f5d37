"""Batched training-free pruning: one top-k mask per batch, re-selected every ``period`` decode steps, with an
activation memory across periods."""

from __future__ import annotations

import math

import torch

from wide.routers.base import Router, RouterSpec, rms_normalize
from wide.routers.registry import register_router

PREFILL = ("shared", "token")


@register_router("batched_topk")
class BatchedTopKRouter(Router):
    """Training-free batched top-k: every token of a batch runs the same ``keep = ceil((1 - s) * G)`` groups.

    Importance of group ``g`` for a token is the Wanda-style estimate of the group's output magnitude,
    ``|rms_norm(h)| @ scores[g]`` (``scores`` as for `wide.routers.TopKRouter`: weight-column norms folded with the
    norm gain), here on the RMS-normalised residual so that tokens weigh alike when it is averaged. Importance is
    averaged over the tokens of the batch and the ``keep`` best groups are chosen by rank, not by a threshold, so
    the realized rate is ``1 - keep / G`` exactly at any batch size (a threshold calibrated on single sequences
    drifts when the rows share one mask: ``benchmarks/batched_topk.py``).

    Schedule in eval mode, per sequence (a forward of more than one token starts one):

    * prefill: the memory starts at the prompt's mean importance and the ``keep`` best groups are selected;
      ``prefill="shared"`` runs every prompt token with that selection, ``"token"`` runs each prompt token with
      its own top-k (the memory and selection are the same either way);
    * decode step ``i = 1, 2, ...``: the step's mean importance is added to the period's sum; when ``i`` is a
      multiple of ``period`` the memory becomes ``memory * mem + (1 - memory) * (period mean)`` and the ``keep``
      best groups of the memory are selected (ties: lower index), used from that step on. Between refreshes
      the selection is kept. ``memory`` 0 selects from the last period alone; near 1, groups that recur over
      many periods stay selected through a period where they are weak.

    All state lives in device tensors updated in place (no host sync), so decode steps can be captured in CUDA
    graphs. Training-mode forwards (LoRA under this routing) select per forward from its tokens and keep no
    state. Padding tokens count like any other (use unpadded batches, as `wide.Generator` does), and like batch-
    coherent decode with a memory, a prompt prefilled in chunks restarts the sequence at every chunk.

    Args:
        spec: The router's spec (its ``group_scores`` are required).
        sparsity: Skip rate to realise; ``None`` takes the spec's target.
        period: Decode steps between selections (``k``), ``>= 1``.
        memory: Decay of the activation memory per period, in ``[0, 1)``.
        prefill: ``"shared"`` or ``"token"`` (see above).
        margin: Logit magnitude of the hard decision.
    """

    deterministic = True

    def __init__(self, spec: RouterSpec, sparsity: float | None = None, period: int = 8, memory: float = 0.5,
                 prefill: str = "shared", margin: float = 1e4):
        super().__init__(spec)
        if spec.group_scores is None:
            raise ValueError(f"router: 'batched_topk' needs weight-based group scores, which policy kind "
                             f"{spec.kind!r} lacks")
        if not (isinstance(period, int) and not isinstance(period, bool) and period >= 1):
            raise ValueError(f"period: must be an integer >= 1, got {period!r}")
        if not (isinstance(memory, (int, float)) and 0.0 <= memory < 1.0):
            raise ValueError(f"memory: must be in [0, 1), got {memory!r}")
        if prefill not in PREFILL:
            raise ValueError(f"prefill: must be one of {PREFILL}, got {prefill!r}")
        s = spec.target_sparsity if sparsity is None else sparsity
        if not 0.0 <= s < 1.0:
            raise ValueError(f"sparsity: must be in [0, 1), got {s!r}")
        g = spec.num_groups
        self.keep = max(1, min(g, math.ceil((1.0 - s) * g - 1e-9)))
        self.period, self.memory, self.prefill, self.margin = period, float(memory), prefill, margin
        self._scores_fn = spec.group_scores
        self.register_buffer("scores", torch.empty(0), persistent=False)
        # the sequence's state: memory, the running period's sum, the selection and the decode-step counter
        self.register_buffer("mem", torch.zeros(g), persistent=False)
        self.register_buffer("acc", torch.zeros(g), persistent=False)
        self.register_buffer("selection", torch.ones(g, dtype=torch.bool), persistent=False)
        self.register_buffer("step", torch.zeros((), dtype=torch.int64), persistent=False)
        self._live = False  # a sequence has started (its prefill, or its first decode step, ran)

    def expected_sparsity(self) -> float:
        return 1.0 - self.keep / self.num_groups

    def importance(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[B, T, G]`` float32 importance of every group for every token of ``hidden [B, T, D]``."""
        if self.scores.numel() == 0 or self.scores.device != hidden.device:
            self.scores = self._scores_fn().to(device=hidden.device, dtype=torch.float32)
        return rms_normalize(hidden.detach()).abs() @ self.scores.t()

    def top(self, score: torch.Tensor) -> torch.Tensor:
        """``[..., G]`` bool: the ``keep`` groups of highest ``score`` (ties: lower index), on the device."""
        order = torch.sort(score, dim=-1, descending=True, stable=True).indices
        ranks = torch.arange(score.shape[-1], device=score.device).expand_as(order)
        return torch.zeros_like(score, dtype=torch.bool).scatter_(-1, order, ranks < self.keep)

    @torch.compiler.disable  # in-place sequence state: eager under torch.compile
    def _start(self, mean: torch.Tensor) -> None:
        self.mem.copy_(mean)
        self.acc.zero_()
        self.step.zero_()
        self.selection.copy_(self.top(mean))
        self._live = True

    @torch.compiler.disable
    def _advance(self, mean: torch.Tensor) -> None:
        self.acc.add_(mean)
        self.step.add_(1)
        refresh = torch.remainder(self.step, self.period) == 0  # decided on the device: graph-safe
        mixed = self.mem * self.memory + self.acc * ((1.0 - self.memory) / self.period)
        self.mem.copy_(torch.where(refresh, mixed, self.mem))
        self.selection.copy_(torch.where(refresh, self.top(self.mem), self.selection))
        self.acc.copy_(torch.where(refresh, torch.zeros_like(self.acc), self.acc))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        imp = self.importance(hidden)  # [B, T, G]
        mean = imp.mean(dim=(0, 1))
        b, t, g = imp.shape
        if self.training:
            keep = self.top(imp) if self.prefill == "token" else self.top(mean).expand(b, t, g)
        else:
            if t > 1 or not self._live:
                self._start(mean)
            else:
                self._advance(mean)
            keep = self.top(imp) if (t > 1 and self.prefill == "token") else self.selection.expand(b, t, g)
        sign = keep.float() * 2 - 1  # a new tensor: later in-place state updates never change this step's mask
        return torch.stack([sign, -sign], dim=-1) * self.margin

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, keep={self.keep}, period={self.period}, memory={self.memory}, "
                f"prefill={self.prefill}")
