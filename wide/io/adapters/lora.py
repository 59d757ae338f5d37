"""``adapter: lora``: peft LoRA on every target module (stage 2's default)."""

from __future__ import annotations

import logging
import re
from typing import Any, Optional

from wide.io.adapters.base import DEFAULT_LORA_ALPHA, Adapter, recorded_settings, register_adapter

log = logging.getLogger(__name__)

_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<ab>[AB])\.(?P<adapter>[^.]+)\.weight$")


def lora_rank_and_targets(shapes: dict[str, tuple[int, ...]]) -> Optional[tuple[int, list[str]]]:
    """The one LoRA rank and the adapted module names a checkpoint's tensor shapes show (``None``: no LoRA)."""
    ranks, targets = set(), set()
    for key, shape in shapes.items():
        m = _KEY.match(key)
        if m and m["ab"] == "A":
            ranks.add(shape[0])
            targets.add(m["module"].rsplit(".", 1)[-1])
    if not ranks:
        return None
    if len(ranks) > 1:
        raise ValueError(f"checkpoint: LoRA adapters of mixed ranks {sorted(ranks)} are not supported")
    return ranks.pop(), sorted(targets)


def lora_alpha(extra: dict[str, Any], where: str, alpha: Optional[float]) -> tuple[float, str]:
    """LoRA alpha and where it came from: the checkpoint's metadata, the ``alpha`` flag, or the default."""
    lora = extra.get("lora")
    recorded = extra.get("lora_alpha", lora.get("alpha") if isinstance(lora, dict) else None)
    if recorded is not None:
        if alpha is not None and float(alpha) != float(recorded):
            raise ValueError(f"lora_alpha: the checkpoint records {float(recorded)}, got {alpha}")
        return float(recorded), "checkpoint"
    if alpha is not None:
        return float(alpha), "flag"
    log.warning("checkpoint: LoRA alpha is not recorded in %s; assuming %s (LoRARecovery's default). "
                "Pass --lora-alpha if the run used another value.", where, DEFAULT_LORA_ALPHA)
    return DEFAULT_LORA_ALPHA, "default"


@register_adapter("lora")
class LoRA(Adapter):
    """peft LoRA. Settings: ``r``, ``alpha``, ``targets`` (module names), optional ``dropout`` (default 0)."""

    marker = "lora_"

    def peft_config(self, settings: dict[str, Any]):
        from peft import LoraConfig

        return LoraConfig(r=settings["r"], lora_alpha=settings["alpha"], lora_dropout=settings.get("dropout", 0.0),
                          target_modules=list(settings["targets"]), bias="none")

    def read(self, shapes: dict[str, tuple[int, ...]], extra: dict[str, Any], where: str,
             alpha: Optional[float] = None) -> Optional[dict[str, Any]]:
        """Rank and targets from the tensor shapes; alpha from the metadata, ``alpha``, or ``DEFAULT_LORA_ALPHA``."""
        found = lora_rank_and_targets(shapes)
        if found is None:
            return None
        rec = recorded_settings(extra, "lora", where) or {}
        value, source = lora_alpha({"lora_alpha": rec["alpha"]} if "alpha" in rec else extra, where, alpha)
        return {"r": found[0], "alpha": value, "alpha_source": source, "targets": found[1]}

    def describe(self, settings: dict[str, Any]) -> str:
        return f"LoRA r={settings['r']} α={settings['alpha']:g}"
