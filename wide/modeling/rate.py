"""Setting a trained model's noise-free skip rate to its target: one shift of the routers' execute margins.

Training decides with hard Gumbel-softmax samples, and a hard sample of two logits executes with probability
``sigmoid(margin)`` at any temperature (the Gumbel-max trick: annealing the temperature sharpens the gradient, not
the sample). The sparsity term therefore drives the *mean* of ``sigmoid(-margin)`` to the target, while the eval
decision skips where ``margin < 0``. The two agree only where margins are large: a router whose margins sit at
``+0.4`` meets a 0.4 target in training and skips nothing in eval (a static router's margins are all alike, so it
shows this most). Low targets come out low and high targets high at eval (SmolLM2-135M by weight, measured on an
H200: 0.25 came out 0.125 and 0.6 came out 0.677; a static router's 0.4 came out 0.117).

:func:`fit_rate` closes the gap after training: it adds one amount to every router's execute margin (one per router
kind when the kinds have their own targets), found by bisection on the rate the eval decision realizes on held-out
batches, so the relative order of layers, kinds, groups and tokens the routers learned is kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, Optional

import torch
from torch import nn

from wide.routers.base import shift_execute_margin

if TYPE_CHECKING:
    from wide.config import WideConfig
    from wide.modeling.runtime import SparsityStats

__all__ = ["RateFit", "fit_rate", "measure_rates", "target_rates"]


def target_rates(stats: "SparsityStats", cfg: "WideConfig",
                 differentiable: bool = False) -> dict[str, tuple[float, torch.Tensor]]:
    """What the sparsity target compares, by name: ``{"all": (sparsity, rate)}`` with the rate by routed weight
    (``sparsity_measure="weight"``) or the router kinds averaged (``"kinds"``), or with per-kind targets
    ``{kind: (target, the kind's rate)}``. The training loss and :func:`fit_rate` read the same rates."""
    if cfg.per_kind_targets:
        return {k: (cfg.target_for(k), stats.realized(k, differentiable=differentiable)) for k in stats.kinds}
    if cfg.sparsity_measure == "weight":
        return {"all": (cfg.sparsity, stats.realized_by_weight(differentiable=differentiable))}
    return {"all": (cfg.sparsity, stats.realized(differentiable=differentiable))}


def _measure_name(cfg: "WideConfig") -> str:
    if cfg.per_kind_targets:
        return "per router kind"
    return "by routed weight" if cfg.sparsity_measure == "weight" else "router kinds averaged"


@dataclass
class RateFit:
    """What :func:`fit_rate` did.

    Attributes:
        targets: The target of each rate, by name (``all``, or the router kinds with per-kind targets).
        before: The eval decision's rates on the batches before the shift.
        after: The rates after it.
        shifts: The amount added to the execute margins of each name's routers (0: left as trained).
        measure: What the rates measure (``by routed weight``, ``router kinds averaged``, ``per router kind``).
        routers: Routers shifted (those with a `wide.Router.logit_bias`).
        fixed: Routers left as they are (none to shift: top-k, random, fixed masks).
        passes: Forward passes over the batches (the first measures ``before``).
        tokens: Tokens each pass measured, over all ranks.
    """

    targets: dict[str, float]
    before: dict[str, float]
    after: dict[str, float]
    shifts: dict[str, float] = field(default_factory=dict)
    measure: str = ""
    routers: int = 0
    fixed: int = 0
    passes: int = 0
    tokens: int = 0

    def max_error(self) -> float:
        """The largest ``|after - target|``."""
        return max(abs(self.after[k] - t) for k, t in self.targets.items())

    def describe(self) -> str:
        """One log line: the rates before and after, the target and the shift."""
        parts = []
        for k, t in self.targets.items():
            name = "" if k == "all" else f"{k} "
            parts.append(f"{name}{self.before[k]:.4f} -> {self.after[k]:.4f} (target {t:.4f}, execute margins "
                         f"{self.shifts.get(k, 0.0):+.4f})")
        fixed = f"; {self.fixed} routers without a threshold left as they are" if self.fixed else ""
        return (f"noise-free skip rate {self.measure}, {self.tokens:,} tokens: " + "; ".join(parts)
                + f"; {self.routers} routers, {self.passes} passes{fixed}")

    def metrics(self, prefix: str = "rate_fit") -> dict[str, float]:
        """Scalars to log: ``{prefix}/before``, ``/after``, ``/target``, ``/shift`` (a ``/<kind>`` suffix per kind)."""
        out = {}
        for k, t in self.targets.items():
            suffix = "" if k == "all" else f"/{k}"
            out.update({f"{prefix}/before{suffix}": self.before[k], f"{prefix}/after{suffix}": self.after[k],
                        f"{prefix}/target{suffix}": t, f"{prefix}/shift{suffix}": self.shifts.get(k, 0.0)})
        return out


@torch.no_grad()
def measure_rates(model: nn.Module, batches: Iterable[dict[str, torch.Tensor]], cfg: "WideConfig",
                  reduce: Optional[Callable[[torch.Tensor], torch.Tensor]] = None
                  ) -> tuple[dict[str, tuple[float, float]], int]:
    """The rates :func:`target_rates` names, token-weighted over ``batches`` (``input_ids [B, T]``, optional
    ``attention_mask``) in the model's current mode, and the tokens counted.

    Args:
        model: A routed model (eval mode: the noise-free decision).
        batches: Batches on the model's device.
        cfg: Its ``WideConfig`` (which rates the target compares).
        reduce: Sums a tensor over data-parallel ranks (``None``: one process).
    """
    from wide.modeling.wrap import sparsity_stats

    names, targets, sums = None, None, None
    for batch in batches:
        ids = batch["input_ids"]
        none = torch.empty(0, dtype=torch.long, device=ids.device)  # logits_to_keep: no position reaches the head
        model(input_ids=ids, attention_mask=batch.get("attention_mask"), logits_to_keep=none, use_cache=False)
        stats = sparsity_stats(model)
        rates = target_rates(stats, cfg)
        n = stats.valid.sum().float() if stats.valid is not None else torch.tensor(float(ids.numel()))
        n = n.to(next(iter(stats.skip.values())).device)
        row = torch.stack([r.float() * n for _, r in rates.values()] + [n])
        names, targets = list(rates), [t for t, _ in rates.values()]
        sums = row if sums is None else sums + row
    if sums is None:
        raise ValueError("fit_rate: no batch to measure the realized rate on")
    if reduce is not None:
        sums = reduce(sums)
    values = (sums[:-1] / sums[-1].clamp_min(1.0)).tolist()  # one host sync per pass
    return {k: (t, v) for k, t, v in zip(names, targets, values)}, int(sums[-1].item())


@torch.no_grad()
def fit_rate(model: nn.Module, batches: list[dict[str, torch.Tensor]], cfg: "WideConfig", *,
             tolerance: float = 0.002, max_passes: int = 40,
             reduce: Optional[Callable[[torch.Tensor], torch.Tensor]] = None) -> Optional[RateFit]:
    """Shifts the routers' execute margins so that the eval (noise-free) decision realizes the target on ``batches``.

    One amount is added to the execute margin of every router that has a `wide.Router.logit_bias` (one amount per
    router kind when ``cfg`` sets per-kind targets: ``attn_sparsity`` / ``ffn_sparsity``), so the routers' learned
    split between layers, kinds, groups and tokens stays. The rate is the one the sparsity target measures
    (:func:`target_rates`: by routed weight, kinds averaged, or per kind), measured by full forwards in eval mode
    (a layer's input depends on the routers before it); the amount is found by bisection, bracketed by doubling
    steps from 0, and stops within ``tolerance`` of the target (or where the rate steps over it: static routers
    move in whole groups; the closer side is kept). A model already within ``tolerance`` is left untouched.

    Args:
        model: A routed model; left in the mode it came in.
        batches: Held-out batches on the model's device, measured once per pass (keep them few).
        cfg: The model's ``WideConfig``.
        tolerance: Allowed ``|realized - target|``.
        max_passes: At most this many passes over ``batches`` (the first measures the rate as trained).
        reduce: Sums a tensor over data-parallel ranks (``None``: one process); every rank must pass the same
            number of batches, and all then shift by the same amounts.

    Returns:
        What was done (:class:`RateFit`), or ``None`` when no router has a threshold to shift (top-k, random).
    """
    from wide.modeling.wrap import runtime_of

    if not (tolerance > 0 and max_passes >= 1):
        raise ValueError(f"tolerance / max_passes: must be > 0 and >= 1, got {tolerance!r}, {max_passes!r}")
    routers = [r for wl in runtime_of(model).layers for r in wl.routers.values()]
    shiftable = [r for r in routers if r.logit_bias() is not None]
    if not shiftable:
        return None
    group_of = {id(r): (r.spec.gates[0] if cfg.per_kind_targets else "all") for r in shiftable}
    was_training = model.training
    model.eval()
    try:
        rates, tokens = measure_rates(model, batches, cfg, reduce)
        groups = [g for g in rates if g in set(group_of.values())]
        fit = RateFit(targets={k: t for k, (t, _) in rates.items()}, before={k: v for k, (_, v) in rates.items()},
                      after={}, measure=_measure_name(cfg), routers=len(shiftable),
                      fixed=len(routers) - len(shiftable), passes=1, tokens=tokens)
        shift = {g: 0.0 for g in groups}  # the amount now added, per group
        lo = {g: -math.inf for g in groups}  # the rate falls as the shift grows: lo is too sparse, hi too dense
        hi = {g: math.inf for g in groups}
        step = {g: 1.0 for g in groups}
        best = {g: (abs(rates[g][1] - rates[g][0]), 0.0) for g in groups}
        while fit.passes < max_passes - 1:  # one pass kept to return to the closest shift
            nxt = dict(shift)
            for g in groups:
                target, rate = rates[g]
                if abs(rate - target) <= tolerance:
                    continue
                if rate > target:
                    lo[g] = shift[g]
                else:
                    hi[g] = shift[g]
                if math.isfinite(lo[g]) and math.isfinite(hi[g]):
                    if hi[g] - lo[g] <= 1e-4 * max(1.0, abs(lo[g])):
                        continue  # the rate steps over the target here (whole groups flip): no shift lands closer
                    nxt[g] = 0.5 * (lo[g] + hi[g])
                elif step[g] <= 2.0 ** 16:
                    nxt[g] = (lo[g] + step[g]) if math.isfinite(lo[g]) else (hi[g] - step[g])
                    step[g] *= 2
            if nxt == shift:
                break
            _apply(shiftable, group_of, {g: nxt[g] - shift[g] for g in groups})
            shift = nxt
            rates, _ = measure_rates(model, batches, cfg, reduce)
            fit.passes += 1
            for g in groups:
                err = abs(rates[g][1] - rates[g][0])
                if err < best[g][0]:
                    best[g] = (err, shift[g])
        chosen = {g: best[g][1] for g in groups}
        if chosen != shift:  # the closest shift was an earlier one: go back to it and measure what it realizes
            _apply(shiftable, group_of, {g: chosen[g] - shift[g] for g in groups})
            rates, _ = measure_rates(model, batches, cfg, reduce)
            fit.passes += 1
        fit.after = {k: v for k, (_, v) in rates.items()}
        fit.shifts = chosen
        return fit
    finally:
        model.train(was_training)


def _apply(routers: list, group_of: dict[int, str], delta: dict[str, float]) -> None:
    for r in routers:
        d = delta.get(group_of[id(r)], 0.0)
        if d:
            shift_execute_margin(r, d)
