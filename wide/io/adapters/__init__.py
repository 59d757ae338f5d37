"""Adapters beside the routers: stage 2's trainable update, injected by peft, saved, read back and merged.

An adapter (``adapter: lora | super | supra`` in a stage-2 recipe) is a registered `Adapter`, one file each:
the substrings its tensor names carry (what a trained-tensor checkpoint keeps besides the routers), the peft
configs it injects, built from the stage's settings, an optional calibration pass over a few batches (a
data-chosen sparse support), and the reader that recovers its settings from a checkpoint. Injection and
merging are written once for every adapter: peft's ``inject_adapter_in_model`` with each of its configs, and a
merge over peft's common tuner-layer base class that also folds tuner layers nested in one another (Supra's
LoRA around SHiRA). A new adapter is one subclass and one ``@register_adapter("name")``.

Built in: ``lora`` (peft LoRA), ``super`` (peft SHiRA on a Wanda- or magnitude-chosen support) and ``supra``
(both, splitting LoRA's parameter budget).
"""

from wide.io.adapters.base import (
    ADAPTERS,
    DEFAULT_LORA_ALPHA,
    Adapter,
    adapter_buffers,
    class_path,
    inject_adapter,
    is_adapter_name,
    merge_adapters,
    read_adapters,
    recorded_settings,
    register_adapter,
    resolve_adapter,
)

# the built-in adapters register themselves on import
from wide.io.adapters.lora import LoRA
from wide.io.adapters.super import Super
from wide.io.adapters.supra import Supra

__all__ = ["ADAPTERS", "DEFAULT_LORA_ALPHA", "Adapter", "LoRA", "Super", "Supra", "adapter_buffers",
           "inject_adapter", "is_adapter_name", "merge_adapters", "read_adapters", "recorded_settings",
           "register_adapter", "resolve_adapter"]
