"""The adapter base class and registry, and what every adapter shares: injection, merging, checkpoint reading."""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Iterator, Optional

import torch
from torch import nn

from wide.registry import Registry, import_class_path

log = logging.getLogger(__name__)

DEFAULT_LORA_ALPHA = 32.0
"""``LoRARecovery``'s LoRA alpha; assumed for checkpoints that do not record theirs."""


class Adapter:
    """One stage-2 adapter: how to build it from the stage's settings, recognise its tensors, and read it back.

    Attributes:
        marker: Substring of the names of this adapter's tensors (``lora_``), when it has one kind of tensor.
        markers: All such substrings (default: ``(marker,)``); checkpoints keep the tensors carrying one.
    """

    marker: str = ""
    markers: tuple[str, ...] = ()
    registered_name: str = ""

    @classmethod
    def tensor_markers(cls) -> tuple[str, ...]:
        return tuple(cls.markers) or ((cls.marker,) if cls.marker else ())

    def settings(self, r: int, alpha: float, dropout: float, targets: list[str], **options: Any) -> dict[str, Any]:
        """JSON-safe settings from a stage-2 run's fields; raises ``ValueError`` naming the bad field.

        Args:
            r: The trainable-parameter budget as a LoRA rank: ``r * (in + out)`` parameters per adapted matrix.
            alpha: LoRA alpha (for a LoRA part).
            dropout: LoRA dropout (for a LoRA part).
            targets: Module names to adapt.
            options: The run's other adapter fields (``lora_share``, ``score``); ignore what does not apply.
        """
        return {"r": r, "alpha": float(alpha), "dropout": dropout, "targets": list(targets)}

    def peft_configs(self, settings: dict[str, Any]) -> list:
        """The peft configs that inject this adapter, in injection order (a later one wraps an earlier one)."""
        return [self.peft_config(settings)]

    def peft_config(self, settings: dict[str, Any]):
        """The one peft config of a single-kind adapter (``peft_configs`` for several)."""
        raise NotImplementedError

    def inject(self, model: nn.Module, settings: dict[str, Any]) -> None:
        """Adds this adapter to ``model`` in place (peft's ``inject_adapter_in_model``, once per config)."""
        import warnings

        from peft import inject_adapter_in_model

        for i, config in enumerate(self.peft_configs(settings)):
            with warnings.catch_warnings():
                if i:  # peft warns that a second config makes several adapters: that is the point here
                    warnings.filterwarnings("ignore", message="Already found a `peft_config`")
                inject_adapter_in_model(config, model)

    def needs_calibration(self, settings: dict[str, Any]) -> bool:
        """Whether ``calibrate`` wants batches before training (a data-chosen support)."""
        return False

    def calibrate(self, model: nn.Module, batches: Iterable[dict[str, torch.Tensor]], settings: dict[str, Any],
                  reduce: Callable[[torch.Tensor], torch.Tensor] = lambda t: t) -> str:
        """Sets data-dependent adapter state from ``batches`` before the first step; returns a log line.

        Args:
            model: The routed model with this adapter injected, on its training device.
            batches: Training batches already on that device.
            settings: As ``settings`` returned them.
            reduce: Mean over data-parallel ranks, so every rank chooses the same state.
        """
        return ""

    def read(self, shapes: dict[str, tuple[int, ...]], extra: dict[str, Any], where: str, **overrides: Any
             ) -> Optional[dict[str, Any]]:
        """This adapter's settings from a checkpoint, or ``None`` when it holds none of its tensors.

        Args:
            shapes: Shape of every tensor in the checkpoint, by name.
            extra: The checkpoint's ``extra`` metadata (what the training task recorded, ``extra["adapter"]``).
            where: The checkpoint's path, for messages.
            overrides: Settings given by the caller for what the checkpoint does not record (``alpha``).
        """
        raise NotImplementedError

    def describe(self, settings: dict[str, Any]) -> str:
        """One short label for reports (``LoRA r=16 α=32``)."""
        return f"{self.registered_name} " + " ".join(f"{k}={v}" for k, v in settings.items() if k != "targets")


ADAPTERS: Registry[Adapter] = Registry("adapter", Adapter)


def register_adapter(name: str):
    """Class decorator: ``@register_adapter("name")`` makes an ``Adapter`` selectable as ``adapter: name``."""
    return ADAPTERS.register(name)


def resolve_adapter(name: str, field: str = "adapter") -> type[Adapter]:
    """A registered adapter by name, or by the class path of an ``Adapter`` subclass (``mypkg.adapters.MyAdapter``:
    imported, which registers it, as a plug-in router is given by ``class_path``)."""
    if name not in ADAPTERS and "." in str(name):
        cls = import_class_path(name, field)
        if not (isinstance(cls, type) and issubclass(cls, Adapter)):
            raise ValueError(f"{field}: {name!r} is not an Adapter subclass")
        if ADAPTERS._items.get(cls.registered_name) is not cls:
            raise ValueError(f"{field}: {name!r} is not registered; decorate it with @register_adapter(\"name\")")
        return cls
    return ADAPTERS.get(name, field=field)


def class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def is_adapter_name(name: str) -> bool:
    """Whether a tensor name belongs to an adapter of any registered kind."""
    return any(m in name for kind in ADAPTERS for m in ADAPTERS.get(kind).tensor_markers())


def adapter_buffers(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Adapter state kept as buffers (a sparse adapter's indices), by name: trained-tensor checkpoints save it."""
    for name, buf in model.named_buffers():
        if is_adapter_name(name):
            yield name, buf


def recorded_settings(extra: dict[str, Any], name: str, where: str) -> Optional[dict[str, Any]]:
    """The settings ``extra["adapter"]`` records for adapter ``name`` (``None`` when it records another or none)."""
    rec = extra.get("adapter")
    if isinstance(rec, dict) and rec.get("name") == name:
        return {k: v for k, v in rec.items() if k not in ("name", "class_path")}
    return None


def read_adapters(path: str, extra: dict[str, Any], **overrides: Any) -> dict[str, dict[str, Any]]:
    """The adapter a trained-tensor checkpoint holds, as ``{name: settings}`` (empty when it holds none).

    The adapter is the one ``extra["adapter"]["name"]`` records; in a checkpoint that records none (written
    before adapters were recorded), the registered adapter whose tensor markers are exactly the ones present.
    Reads tensor names and shapes only, no tensor data.

    Args:
        path: The ``.safetensors`` file.
        extra: Its ``extra`` metadata.
        overrides: Settings for what the checkpoint does not record (``alpha=8``); ``None`` values are dropped.
    """
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        shapes = {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}
    overrides = {k: v for k, v in overrides.items() if v is not None}
    rec = extra.get("adapter")
    if isinstance(rec, dict):
        name = rec.get("name")
        if name not in ADAPTERS and rec.get("class_path"):  # a plug-in: importing its module registers it
            try:
                resolve_adapter(rec["class_path"], field="checkpoint")
            except ValueError:
                pass  # reported just below, with the registered names
        if name not in ADAPTERS:
            raise ValueError(f"checkpoint: {path} was trained with adapter {name!r}, which is not registered here "
                             f"(registered: {', '.join(ADAPTERS)}); import the package that registers it")
    else:
        present = {m for kind in ADAPTERS for m in ADAPTERS.get(kind).tensor_markers() if any(m in k for k in shapes)}
        if not present:
            return {}
        names = [kind for kind in ADAPTERS if set(ADAPTERS.get(kind).tensor_markers()) == present]
        if len(names) != 1:
            raise ValueError(f"checkpoint: {path} holds adapter tensors marked {sorted(present)}, which "
                             f"{'no' if not names else 'more than one'} registered adapter matches")
        name = names[0]
    settings = ADAPTERS.get(name)().read(shapes, extra, str(path), **overrides)
    if settings is None:
        raise ValueError(f"checkpoint: {path} records adapter {name!r} but holds none of its tensors")
    return {name: settings}


def inject_adapter(model: nn.Module, kind: str, settings: dict[str, Any]) -> nn.Module:
    """Adds the adapter ``kind`` (a registered name) with ``settings`` to ``model`` in place, through peft."""
    ADAPTERS.get(kind, field="adapter")().inject(model, settings)
    return model


def merge_adapters(model: nn.Module) -> int:
    """Folds every peft adapter into its base layer and puts the plain base layer back; returns how many modules.

    peft's own ``merge_and_unload`` is a method of its tuner model, which ``inject_adapter_in_model`` (how
    `wide` adds adapters in place) does not return; every peft tuner layer, whatever its kind, has ``merge``
    and ``get_base_layer``, so one loop serves all kinds. A tuner layer wrapping another (Supra: LoRA around
    SHiRA, the nesting peft's mixed models build) merges each level into the one base layer underneath.
    """
    from peft.tuners.tuners_utils import BaseTunerLayer

    merged = 0
    outer = [(name, m) for name, m in model.named_modules()
             if isinstance(m, BaseTunerLayer) and not name.endswith("base_layer")]
    for name, module in outer:
        layer = module
        while isinstance(layer, BaseTunerLayer):
            layer.merge()
            layer = layer.base_layer
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, module.get_base_layer())
        merged += 1
    return merged
