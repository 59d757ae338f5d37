"""`SparsityMeter`: realized routing over many forwards, token-weighted over valid tokens."""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

import wide


class SparsityMeter:
    """Accumulates what the routers skipped across the forwards of one evaluation.

    After each forward, ``update(model, valid_tokens)`` reads ``wide.sparsity_stats(model)`` (per layer
    and kind: the skipped fraction of (valid token, group) units of that forward) and adds it weighted
    by that forward's number of valid tokens. Sums stay on the device; ``result()`` syncs once.

    The headline number is the same quantity the training loss targets (``SparsityStats.realized``):
    the mean over routed layers and router kinds of the per-layer skip rate, here token-weighted over
    all forwards. Layers listed in ``WideConfig.dense_layers`` are not routed and do not count.
    A model that is not routed realizes 0.
    """

    def __init__(self, model: nn.Module):
        self.routed = wide.is_routed(model) or _peft_routed(model)
        self.model = model
        self.tokens = 0.0
        self.layers: Optional[list[int]] = None
        self._sums: dict[str, torch.Tensor] = {}
        self._by_weight: Optional[torch.Tensor] = None
        self._weight: Optional[torch.Tensor] = None

    def update(self, valid_tokens: torch.Tensor) -> None:
        """Adds the last forward's routing; ``valid_tokens`` is a 0-d tensor (or int) of counted tokens."""
        n = valid_tokens if isinstance(valid_tokens, torch.Tensor) else torch.tensor(float(valid_tokens))
        n = n.float()
        if not self.routed:
            self._weight = n if self._weight is None else self._weight + n.to(self._weight.device)
            return
        stats = wide.sparsity_stats(self.model)
        if stats is None:
            return
        self.layers = stats.layers
        n = n.to(next(iter(stats.skip.values())).device)
        for kind, rates in stats.skip.items():
            add = rates.float() * n
            self._sums[kind] = add if kind not in self._sums else self._sums[kind] + add
        add = stats.realized_by_weight().float() * n
        self._by_weight = add if self._by_weight is None else self._by_weight + add
        self._weight = n if self._weight is None else self._weight + n

    def result(self) -> dict[str, Any]:
        """``{"sparsity": float, "by_weight": float, "by_kind": {kind: float}, "per_layer": {kind: [float]}, "layers": [...],
        "tokens": int}``; ``by_weight`` is the share of routed weight work skipped (`SparsityStats.realized_by_weight`),
        ``sparsity`` the kinds-averaged rate."""
        weight = float(self._weight) if self._weight is not None else 0.0
        if not self.routed or not self._sums or weight == 0:
            return {"sparsity": 0.0, "by_kind": {}, "per_layer": {}, "layers": [], "tokens": int(weight)}
        per_layer = {k: (v / weight).cpu().tolist() for k, v in self._sums.items()}
        by_kind = {k: sum(v) / len(v) for k, v in per_layer.items()}
        return {
            "sparsity": sum(by_kind.values()) / len(by_kind),
            "by_weight": float(self._by_weight) / weight,
            "by_kind": by_kind,
            "per_layer": per_layer,
            "layers": list(self.layers or []),
            "tokens": int(weight),
        }


def merge_sparsity(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Token-weighted merge of several ``SparsityMeter.result()`` dicts (e.g. over tasks)."""
    parts = [p for p in parts if p and p.get("tokens")]
    total = sum(p["tokens"] for p in parts)
    if not total:
        return {"sparsity": 0.0, "by_kind": {}, "per_layer": {}, "layers": [], "tokens": 0}
    routed = [p for p in parts if p["per_layer"]]
    if not routed:
        return {"sparsity": 0.0, "by_kind": {}, "per_layer": {}, "layers": [], "tokens": total}
    kinds = list(routed[0]["per_layer"])
    per_layer = {}
    for kind in kinds:
        n_layers = len(routed[0]["per_layer"][kind])
        per_layer[kind] = [sum(p["per_layer"][kind][i] * p["tokens"] for p in routed) / total for i in range(n_layers)]
    by_kind = {k: sum(v) / len(v) for k, v in per_layer.items()}
    out = {"sparsity": sum(by_kind.values()) / len(by_kind), "by_kind": by_kind, "per_layer": per_layer,
           "layers": routed[0]["layers"], "tokens": total}
    if all("by_weight" in p for p in routed):
        out["by_weight"] = sum(p["by_weight"] * p["tokens"] for p in routed) / total
    return out


def _peft_routed(model: nn.Module) -> bool:
    try:
        wide.modeling.runtime_of(model)
        return True
    except ValueError:
        return False
