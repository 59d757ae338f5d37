"""Granularity policies: which routers a layer gets, what each one gates, and how it decides its masks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from wide.config import WideConfig
    from wide.policies.coherent import CoherentDecode
    from wide.routers.base import Router

SUBLAYERS = ("attn", "ffn")
"""The sub-layers of a decoder layer a router's mask can gate, in the order they run."""


@dataclass(frozen=True)
class LayerShape:
    """The shapes of one decoder layer that routing depends on."""

    layer_idx: int
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int

    @property
    def gqa_ratio(self) -> int:
        return self.num_heads // self.num_kv_heads


@dataclass(frozen=True)
class RouterSlot:
    """One router a policy asks for, and what its mask gates.

    Attributes:
        kind: The router's name in its layer (``WideLayer.routers[kind]``, ``RouterSpec.kind``): any name.
        num_groups: Number of groups G the router decides on.
        group_size: Units per group of the gated sub-layer: query heads (attention) or channels (FFN); 0 when
            one decision (``num_groups`` 1) covers whole sub-layers, broadcast over their heads / channels.
        gates: The sub-layers (of ``SUBLAYERS``) the mask gates; empty means ``(kind,)``. A slot gating more
            than one makes one decision per token (``num_groups`` 1, ``group_size`` 0).
    """

    kind: str
    num_groups: int
    group_size: int
    gates: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        gates = tuple(self.gates) or (self.kind,)
        object.__setattr__(self, "gates", gates)
        if any(g not in SUBLAYERS for g in gates) or len(set(gates)) != len(gates):
            raise ValueError(f"RouterSlot {self.kind!r}: gates must be distinct names of {SUBLAYERS}, got {gates}")
        if not (isinstance(self.num_groups, int) and self.num_groups >= 1):
            raise ValueError(f"RouterSlot {self.kind!r}: num_groups must be a positive integer, got {self.num_groups!r}")
        if (self.group_size == 0 and self.num_groups != 1) or (len(gates) > 1 and self.group_size != 0):
            raise ValueError(f"RouterSlot {self.kind!r}: a decision over whole sub-layers (group_size 0, which "
                             f"gating several needs) has num_groups 1, got {self.num_groups} x {self.group_size}")

    @property
    def reads(self) -> str:
        """The sub-layer whose input (the pre-norm residual) the router reads: the first one it gates."""
        return min(self.gates, key=SUBLAYERS.index)


def gumbel_ste(logits: torch.Tensor, tau: float, noise: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Hard Gumbel-softmax with a straight-through estimator: logits ``[B, T, G, 2]`` -> ``[B, T, G]`` float,
    exactly 0/1 forward (1 = execute), gradient through the soft sample at temperature ``tau``.

    ``noise`` is standard Gumbel noise shaped like ``logits`` (the runtime's seeded draw), else drawn here.
    """
    if noise is None:
        return F.gumbel_softmax(logits.float(), tau=tau, hard=True, dim=-1)[..., 0]
    soft = ((logits.float() + noise) / tau).softmax(-1)[..., 0]
    hard = (soft >= 0.5).to(soft.dtype)  # argmax of two, ties execute (as gumbel_softmax's first index)
    return hard - soft.detach() + soft


def argmax_mask(logits: torch.Tensor) -> torch.Tensor:
    """``[B, T, G]`` bool: execute where the execute logit is at least the skip logit (ties execute)."""
    return logits[..., 0] >= logits[..., 1]


class Policy:
    """Base class: maps a layer's shape and the config to router slots, and owns every routing decision.

    Routed layers call :meth:`mask` only; it picks one method per mode, each overridable on its own:

    ============================  ===========================================  =======================
    mode                          when                                         method
    ============================  ===========================================  =======================
    training                      ``model.train()``                            :meth:`train_mask`
    eval                          ``model.eval()``: prefill, per-token decode  :meth:`eval_mask`
    batch-coherent decode         eval, one new token a row, coherent decode   :meth:`coherent_mask`
                                  on (`wide.set_coherent_decode`)
    ============================  ===========================================  =======================

    Overriding one changes that mode only: a plug-in that overrides :meth:`train_mask` keeps the default eval
    decision (the argmax of the router's logits, through the router's fast path); one that wants another eval
    decision overrides :meth:`eval_mask` (and :meth:`coherent_mask` for coherent decode steps) too.
    """

    registered_name: str = ""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "decide" in cls.__dict__:
            raise TypeError(f"{cls.__qualname__}: Policy.decide(logits, ...) was split by mode: override "
                            "train_mask (training), eval_mask (eval) or coherent_mask (batch-coherent decode)")

    # ---- structure ------------------------------------------------------------------------------

    def slots(self, shape: LayerShape, cfg: "WideConfig") -> list[RouterSlot]:
        raise NotImplementedError

    def validate(self, shape: LayerShape, cfg: "WideConfig") -> None:
        """Raises ``ValueError`` naming the config field when the model cannot be routed this way."""

    def target_sparsity(self, slot: RouterSlot, cfg: "WideConfig") -> float:
        """The target skip rate of ``slot``'s router: its sub-layer's (``attn_sparsity`` / ``ffn_sparsity``
        or ``sparsity``), the global ``sparsity`` for a slot gating several."""
        return cfg.target_for(slot.gates[0]) if len(slot.gates) == 1 else cfg.sparsity

    # ---- the decision ---------------------------------------------------------------------------

    def mask(self, router: "Router", hidden: torch.Tensor, *, training: bool, tau: float = 1.0,
             noise_like: Optional[Callable[[torch.Tensor], Optional[torch.Tensor]]] = None, backend: str = "torch",
             coherent: Optional["CoherentDecode"] = None, state: Optional[dict] = None) -> torch.Tensor:
        """The execute mask ``[B, T, G]`` of ``router`` for its input ``hidden [B, T, D]``, from the method of the
        current mode (see the class docstring); not meant to be overridden.

        Args:
            router: The slot's router.
            hidden: The pre-norm residual it reads.
            training: Whether the layer is in training mode.
            tau: Gumbel-softmax temperature (training).
            noise_like: Gives the Gumbel noise for logits (the runtime's seeded draw) or ``None`` (training).
            backend: Kernel backend of routed inference, ``"torch"`` when kernels are off (eval).
            coherent: Batch-coherent decode settings, ``None`` when off.
            state: This router's coherent decode state (kept by its layer for the current sequence).
        """
        if training:
            return self.train_mask(router, hidden, tau=tau, noise_like=noise_like)
        if coherent is not None and hidden.shape[1] == 1:
            state = {} if state is None else state  # none kept: every step selects afresh
            return self.coherent_mask(router, hidden, coherent=coherent, state=state, backend=backend)
        return self.eval_mask(router, hidden, backend=backend)

    def train_mask(self, router: "Router", hidden: torch.Tensor, *, tau: float,
                   noise_like: Optional[Callable[[torch.Tensor], Optional[torch.Tensor]]] = None) -> torch.Tensor:
        """Training: ``[B, T, G]`` float, exactly 0/1 forward, gradient through the straight-through estimator.

        Default: :func:`gumbel_ste` of ``router(hidden)`` at ``tau`` with the noise ``noise_like`` gives;
        a ``deterministic`` router takes the argmax instead (no noise, no gradient).
        """
        logits = router(hidden)
        if getattr(router, "deterministic", False):
            return argmax_mask(logits).float()
        return gumbel_ste(logits, tau, noise_like(logits) if noise_like is not None else None)

    def eval_mask(self, router: "Router", hidden: torch.Tensor, *, backend: str = "torch") -> torch.Tensor:
        """Eval (every forward but a coherent decode step): ``[B, T, G]`` bool (float 0/1 allowed), 1 = execute.

        Default: the argmax of the router's logits (ties execute) through ``router.execute_decision``, one
        `wide.kernels.router_margin` launch for the linear and low-rank routers; a router whose ``forward`` a
        subclass replaced decides from that ``forward`` (see `wide.routers.Router`).
        """
        return router.execute_decision(hidden, backend=backend)

    def coherent_mask(self, router: "Router", hidden: torch.Tensor, *, coherent: "CoherentDecode", state: dict,
                      backend: str = "torch") -> torch.Tensor:
        """Batch-coherent decode step (``hidden [B, 1, D]``): one mask shared by every row, ``[B, 1, G]`` bool.

        Default: `CoherentDecode.mask` (a shared top-k of the rows' execute margins, ``state`` its memory).
        """
        return coherent.mask(router, hidden, state, backend=backend)
