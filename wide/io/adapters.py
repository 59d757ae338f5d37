"""Adapters beside the routers: peft injects them, `wide` saves, reads back and merges them, one kind per class.

An adapter kind (LoRA today) is a registered `Adapter`: the substring its parameter names carry (what a
trained-tensor checkpoint keeps besides the routers), its peft config built from plain settings, and the
reader that recovers those settings from a checkpoint's tensor shapes and metadata. Injection and merging are
written once for every kind: peft's ``inject_adapter_in_model`` with the kind's config, and a merge over
peft's common tuner-layer base class. A new kind (say peft's SHiRA) is one subclass and one registration.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Optional

from torch import nn

from wide.registry import Registry

log = logging.getLogger(__name__)

DEFAULT_LORA_ALPHA = 32.0
"""``LoRARecovery``'s LoRA alpha; assumed for checkpoints that do not record theirs."""


class Adapter:
    """One kind of peft adapter: how to configure it, recognise its tensors, and read it back from a checkpoint.

    Attributes:
        marker: Substring of the names of this kind's parameters (``lora_``); checkpoints keep these tensors.
    """

    marker: str = ""
    registered_name: str = ""

    def peft_config(self, settings: dict[str, Any]):
        """The peft config that injects this kind with ``settings`` (as ``read`` returns them, plus ``dropout``)."""
        raise NotImplementedError

    def read(self, shapes: dict[str, tuple[int, ...]], extra: dict[str, Any], where: str, **overrides: Any
             ) -> Optional[dict[str, Any]]:
        """This kind's settings from a checkpoint, or ``None`` when it holds none of its tensors.

        Args:
            shapes: Shape of every tensor in the checkpoint, by name.
            extra: The checkpoint's ``extra`` metadata (what the training task recorded).
            where: The checkpoint's path, for messages.
            overrides: Settings given by the caller for what the checkpoint does not record.
        """
        raise NotImplementedError


ADAPTERS: Registry[Adapter] = Registry("adapter", Adapter)


def register_adapter(name: str):
    """Class decorator: ``@register_adapter("name")`` makes an ``Adapter`` kind known to checkpoints and loading."""
    return ADAPTERS.register(name)


@register_adapter("lora")
class LoRA(Adapter):
    """peft LoRA. Settings: ``r``, ``alpha``, ``targets`` (module names), optional ``dropout`` (default 0)."""

    marker = "lora_"
    _KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<ab>[AB])\.(?P<adapter>[^.]+)\.weight$")

    def peft_config(self, settings: dict[str, Any]):
        from peft import LoraConfig

        return LoraConfig(r=settings["r"], lora_alpha=settings["alpha"], lora_dropout=settings.get("dropout", 0.0),
                          target_modules=list(settings["targets"]), bias="none")

    def read(self, shapes: dict[str, tuple[int, ...]], extra: dict[str, Any], where: str,
             alpha: Optional[float] = None) -> Optional[dict[str, Any]]:
        """Rank and targets from the tensor shapes; alpha from the metadata, ``alpha``, or ``DEFAULT_LORA_ALPHA``."""
        ranks, targets = set(), set()
        for key, shape in shapes.items():
            m = self._KEY.match(key)
            if m and m["ab"] == "A":
                ranks.add(shape[0])
                targets.add(m["module"].rsplit(".", 1)[-1])
        if not ranks:
            return None
        if len(ranks) > 1:
            raise ValueError(f"checkpoint: LoRA adapters of mixed ranks {sorted(ranks)} are not supported")
        lora = extra.get("lora")
        recorded = extra.get("lora_alpha", lora.get("alpha") if isinstance(lora, dict) else None)
        if recorded is not None:
            value, source = float(recorded), "checkpoint"
            if alpha is not None and float(alpha) != value:
                raise ValueError(f"lora_alpha: the checkpoint records {value}, got {alpha}")
        elif alpha is not None:
            value, source = float(alpha), "flag"
        else:
            value, source = DEFAULT_LORA_ALPHA, "default"
            log.warning("checkpoint: LoRA alpha is not recorded in %s; assuming %s (LoRARecovery's default). "
                        "Pass --lora-alpha if the run used another value.", where, value)
        return {"r": ranks.pop(), "alpha": value, "alpha_source": source, "targets": sorted(targets)}


def is_adapter_name(name: str) -> bool:
    """Whether a parameter name belongs to an adapter of any registered kind."""
    return any(ADAPTERS.get(kind).marker in name for kind in ADAPTERS)


def read_adapters(path: str, extra: dict[str, Any], overrides: Optional[dict[str, dict[str, Any]]] = None
                  ) -> dict[str, dict[str, Any]]:
    """The settings of every adapter kind a trained-tensor checkpoint holds, by kind name.

    Reads tensor names and shapes only, no tensor data.

    Args:
        path: The ``.safetensors`` file.
        extra: Its ``extra`` metadata.
        overrides: Per kind, settings for what the checkpoint does not record (``{"lora": {"alpha": 8}}``).
    """
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        shapes = {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}
    found = {}
    for kind in ADAPTERS:
        settings = ADAPTERS.get(kind)().read(shapes, extra, str(path), **(overrides or {}).get(kind, {}))
        if settings is not None:
            found[kind] = settings
    return found


def inject_adapter(model: nn.Module, kind: str, settings: dict[str, Any]) -> nn.Module:
    """Adds adapters of ``kind`` (a registered name) with ``settings`` to ``model`` in place, through peft."""
    from peft import inject_adapter_in_model

    inject_adapter_in_model(ADAPTERS.get(kind, field="adapter")().peft_config(settings), model)
    return model


def merge_adapters(model: nn.Module) -> int:
    """Folds every peft adapter into its base layer and puts the plain base layer back; returns how many.

    peft's own ``merge_and_unload`` is a method of its tuner model, which ``inject_adapter_in_model`` (how
    `wide` adds adapters in place) does not return; every peft tuner layer, whatever its kind, has ``merge``
    and ``get_base_layer``, so one loop serves all kinds.
    """
    from peft.tuners.tuners_utils import BaseTunerLayer

    merged = 0
    for name, module in list(model.named_modules()):
        if not isinstance(module, BaseTunerLayer):
            continue
        module.merge()
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, module.get_base_layer())
        merged += 1
    return merged
