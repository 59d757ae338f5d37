"""``adapter: supra``: LoRA and a sparse (SHiRA) update on the same modules, splitting LoRA's parameter budget.

With budget rank ``r`` and ``lora_share`` ``s``, LoRA gets rank ``round(r * s)`` and the sparse support the
remaining ``r - round(r * s)`` ranks' worth of entries (``(r - r_lora) * (in + out)`` per matrix, chosen as in
``super``), so the total equals LoRA of rank ``r``. The recorded ``alpha`` is the recipe's (for rank ``r``); the
LoRA part uses ``alpha * r_lora / r``, keeping the LoRA recipe's scale ``alpha / r``.

peft's SHiRA layer refuses to wrap another tuner layer ("SHiRA does not support nested base layers"), while a
LoRA layer wraps any: SHiRA is injected first and LoRA around it, the nesting peft's mixed models
(``PeftMixedModel``) build, here in place so parameter names keep the HF model's. The forward is
``x (W + S) + scale * B A x``; ``merge_adapters`` folds both levels into ``W``.
"""

from __future__ import annotations

from typing import Any, Optional

from wide.io.adapters.base import ADAPTERS, register_adapter, recorded_settings
from wide.io.adapters.lora import lora_alpha, lora_rank_and_targets
from wide.io.adapters.super import Super


@register_adapter("supra")
class Supra(Super):
    """LoRA rank ``lora_r`` (alpha ``alpha * lora_r / r``) + SHiRA rank ``sparse_r`` on ``targets``, support by
    ``score``."""

    marker = ""
    markers = ("shira_", "lora_")

    def settings(self, r: int, alpha: float, dropout: float, targets: list[str], score: str = "wanda",
                 lora_share: float = 0.5, **options: Any) -> dict[str, Any]:
        base = super().settings(r, alpha, dropout, targets, score=score)
        if not (isinstance(lora_share, (int, float)) and 0 < lora_share < 1):
            raise ValueError(f"supra_lora_share: must be in (0, 1), got {lora_share!r}")
        lora_r = int(round(r * lora_share))
        if not 0 < lora_r < r:
            raise ValueError(f"supra_lora_share: {lora_share} of a rank-{r} budget leaves LoRA rank {lora_r} and "
                             f"sparse rank {r - lora_r}; both must be >= 1 (raise lora_r or move the share)")
        return {"r": r, "lora_r": lora_r, "sparse_r": r - lora_r, "alpha": float(alpha), "dropout": dropout,
                "targets": base["targets"], "score": score}

    def peft_configs(self, settings: dict[str, Any]) -> list:
        lora = ADAPTERS.get("lora")().peft_config({**settings, "r": settings["lora_r"],
                                                   "alpha": settings["alpha"] * settings["lora_r"] / settings["r"]})
        return [self.sparse_config(settings["sparse_r"], settings["targets"]), lora]  # SHiRA inside, LoRA around

    def read(self, shapes: dict[str, tuple[int, ...]], extra: dict[str, Any], where: str,
             alpha: Optional[float] = None) -> Optional[dict[str, Any]]:
        has_sparse, has_lora = self.check_tensors(shapes, where), lora_rank_and_targets(shapes)
        if not has_sparse and has_lora is None:
            return None
        rec = recorded_settings(extra, self.registered_name, where)
        if rec is None or not has_sparse or has_lora is None:
            raise ValueError(f"checkpoint: {where} is not a whole supra checkpoint (SHiRA tensors: {has_sparse}, "
                             f"LoRA tensors: {has_lora is not None}, recorded settings: {rec is not None})")
        if has_lora[0] != rec["lora_r"]:
            raise ValueError(f"checkpoint: {where} records LoRA rank {rec['lora_r']}, its tensors have {has_lora[0]}")
        value, _ = lora_alpha({"lora_alpha": rec["alpha"]}, where, alpha)
        return {**rec, "alpha": value}

    def describe(self, settings: dict[str, Any]) -> str:
        alpha = settings["alpha"] * settings["lora_r"] / settings["r"]
        return (f"LoRA r={settings['lora_r']} α={alpha:g} + sparse r={settings['sparse_r']} "
                f"({settings['score']} support)")
