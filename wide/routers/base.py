"""The router contract: ``forward(hidden [B, T, D]) -> logits [B, T, G, 2]`` (index 0 execute, 1 skip)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import nn


@dataclass(frozen=True)
class RouterSpec:
    """Everything a router factory learns about the one router it builds.

    Attributes:
        kind: The router's name in its layer (``WideLayer.routers[kind]``), the policy's slot kind: ``attn``,
            ``ffn``, ``layer`` for the built-in policies, any name for a plug-in policy.
        layer_idx: Index of the decoder layer.
        num_layers: Number of decoder layers in the model.
        hidden_size: Width D of the residual stream the router reads.
        num_groups: Number of routing groups G.
        group_size: Units per group of the gated sub-layer (query heads for attention, channels for the FFN);
            0 when one decision covers whole sub-layers.
        target_sparsity: The target skip rate of this router.
        rank: The configured bottleneck rank (``WideConfig.router_rank``).
        group_scores: Lazily computes a ``[G, D]`` non-negative matrix whose product with ``|hidden|``
            estimates each group's output norm (weight-column norms folded with the norm gain); used by
            training-free routers. ``None`` when the policy has no such estimate.
        gates: The sub-layers (``attn``, ``ffn``) this router's mask gates; empty means ``(kind,)``.
    """

    kind: str
    layer_idx: int
    num_layers: int
    hidden_size: int
    num_groups: int
    group_size: int
    target_sparsity: float
    rank: int = 32
    group_scores: Optional[Callable[[], torch.Tensor]] = None
    gates: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "gates", tuple(self.gates) or (self.kind,))


FAST_PATH = ("execute_margin", "execute_decision", "margin_weights")
"""The eval fast-path methods of `Router`: each must give the decision :meth:`Router.forward` gives."""

FORWARD_BOUND = (*FAST_PATH, "logit_bias")
"""The methods of `Router` that describe what :meth:`Router.forward` computes: a subclass that replaces ``forward``
gets `Router`'s defaults of them back (see `Router`)."""


def _owner(cls: type, name: str) -> type:
    """The class in ``cls``'s MRO that defines attribute ``name``."""
    return next(k for k in cls.__mro__ if name in k.__dict__)


class Router(nn.Module):
    """Base class of all routers.

    Subclasses take the ``RouterSpec`` as their first constructor argument (further keyword arguments
    are theirs, settable from YAML through ``init_args``) and return two logits per group.

    The eval fast path (:meth:`execute_margin`, :meth:`execute_decision`, :meth:`margin_weights`; see
    ``FAST_PATH``) and :meth:`logit_bias` are trusted only where they provably describe what :meth:`forward` does:
    where they are defined by the class that defines ``forward`` or by a subclass of it. A subclass that overrides
    ``forward`` below a class with a fast path (say ``LowRankRouter``) gets the forward-derived defaults of
    `Router` back when the class is made, so its eval and batch-coherent decode decisions follow its own
    ``forward`` (and nothing shifts its threshold); re-declare a method in the subclass's body
    (``execute_decision = LowRankRouter.execute_decision``) only when the new ``forward`` gives the same decisions.
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        forward = _owner(cls, "forward")
        for name in FORWARD_BOUND:
            owner = _owner(cls, name)
            if owner is not Router and not issubclass(owner, forward):
                # inherited from a class whose forward this one replaced: it would compute the parent's decision
                setattr(cls, name, Router.__dict__[name])

    deterministic: bool = False
    """True for routers whose decision is the argmax even in training (no Gumbel noise, no gradient)."""

    def __init__(self, spec: RouterSpec):
        super().__init__()
        self.spec = spec
        self.num_groups = spec.num_groups

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        """Returns logits ``[B, T, G, 2]`` for ``hidden [B, T, D]``."""
        raise NotImplementedError

    def execute_margin(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[B, T, G]`` execute logit minus skip logit: the eval decision executes where it is ``>= 0``.

        The default takes it from :meth:`forward`; routers whose last layer is linear override it with
        that layer's two rows folded into one (fewer launches per decode step, same decision).
        """
        logits = self(hidden)
        return logits[..., 0] - logits[..., 1]

    def execute_decision(self, hidden: torch.Tensor, backend: str = "torch", margin: bool = False) -> torch.Tensor:
        """``[B, T, G]`` bool eval decision (execute where the margin is ``>= 0``), or with ``margin`` the
        margin itself as float32 (batch-coherent decode averages it over the batch).

        ``backend`` is the kernel backend of routed inference (``"torch"`` when kernels are off). The
        default uses :meth:`execute_margin`; the linear and low-rank routers run either as one
        `wide.kernels.router_margin` launch on the triton backend.
        """
        m = self.execute_margin(hidden)
        return m.float() if margin else m >= 0

    def margin_weights(self):
        """``(down, up, bias, normalize)`` when the eval margin is `wide.kernels.router_margin` of these tensors
        (then batch-coherent decode routes a step in one `wide.kernels.coherent_route` launch), else ``None``."""
        return None

    def logit_bias(self) -> Optional[nn.Parameter]:
        """The parameter that :meth:`forward` adds to its logits, one (execute, skip) pair per group in order
        (``[2G]`` interleaved, or ``[G, 2]``), or ``None`` when there is none.

        Adding ``d`` to its execute entries adds ``d`` to every execute margin: `shift_execute_margin` moves the
        eval threshold that way (`wide.modeling.fit_rate` sets a trained model's realized rate to its target).
        Routers deciding by rank (top-k) or at a set rate have none.
        """
        return None

    def expected_sparsity(self) -> float:
        """The skip rate this router is expected to realize (its target unless it knows better).

        Routed inference passes ``1 - expected_sparsity()`` to the kernels as a density hint, so they
        choose their routed or dense path without reading the mask on the host; it never changes
        results. Override it if your router realizes a rate far from ``spec.target_sparsity``.
        """
        return float(self.spec.target_sparsity)

    def extra_repr(self) -> str:
        return f"kind={self.spec.kind}, layer={self.spec.layer_idx}, groups={self.num_groups}"


def rms_normalize(hidden: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Parameter-free RMS normalisation: residual-stream scale grows with depth, routers should not care."""
    hidden = hidden.float()
    return torch.nn.functional.rms_norm(hidden, (hidden.shape[-1],), eps=eps)


def shift_execute_margin(router: Router, delta) -> bool:
    """Adds ``delta`` (a number, or ``[G]`` per group) to ``router``'s execute margins, in place, through its
    :meth:`Router.logit_bias`; ``False`` (nothing changed) when it has none.

    An FSDP2-sharded bias (a ``DTensor``) takes its own shard of the change, computed on every rank alike.
    """
    bias = router.logit_bias()
    if bias is None:
        return False
    with torch.no_grad():
        full = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device).view(-1, 2)
        full[:, 0] = torch.as_tensor(delta, dtype=torch.float32, device=bias.device)
        full = full.view(bias.shape).to(bias.dtype)
        from torch.distributed.tensor import DTensor, distribute_tensor

        if isinstance(bias, DTensor):
            full = distribute_tensor(full, bias.device_mesh, bias.placements,
                                     src_data_rank=None)
        bias.add_(full)  # in place: the version bump makes `FoldedMargin` fold it again
    return True


class FoldedMargin:
    """Execute-minus-skip rows of a linear layer with ``2G`` outputs (execute, skip interleaved), folded to ``G``.

    Recomputed only when the layer's parameters change (in place or replaced), so eval-mode decisions
    cost one small GEMM instead of the ``2G``-wide one plus a comparison of the two halves.
    """

    def __init__(self) -> None:
        self._key: tuple = ()
        self._w: torch.Tensor | None = None
        self._b: torch.Tensor | None = None

    @torch.compiler.disable  # a host-side cache (data pointers, versions): eager under torch.compile
    def weights(self, layer: torch.nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The folded ``[G, in]`` weight and ``[G]`` bias (or None) of ``layer``, recomputed only when it changed."""
        w, b = layer.weight, layer.bias
        key = (w.data_ptr(), w._version, w.device, w.dtype) + ((b.data_ptr(), b._version) if b is not None else ())
        if key != self._key:
            with torch.no_grad():
                w2 = w.view(-1, 2, w.shape[-1])
                self._w = (w2[:, 0] - w2[:, 1]).contiguous()
                if b is not None:
                    b2 = b.view(-1, 2)
                    self._b = (b2[:, 0] - b2[:, 1]).contiguous()
                else:
                    self._b = None
            self._key = key
        return self._w, self._b


def split_logits(out: torch.Tensor, num_groups: int) -> torch.Tensor:
    """``[..., 2G] -> [..., G, 2]``."""
    return out.unflatten(-1, (num_groups, 2))
