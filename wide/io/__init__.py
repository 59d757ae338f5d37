"""Checkpoints and model folders: what `wide` writes and reads back.

- :mod:`wide.io.checkpoint`: trained-tensor checkpoints (router and adapter tensors as safetensors, with the
  ``WideConfig`` and the base model's identity); a sharded model's tensors are gathered by the caller.
- :mod:`wide.io.adapters`: stage-2 adapters (lora, super, supra: one file each, registered), injected and merged
  through peft, once for every kind.
- :mod:`wide.io.folder`: ``export`` / ``load`` of routed model folders.
- :mod:`wide.io.loading`: device and dtype resolution; the dense, training-free routed or checkpointed model.

Depends on config, modeling and asset resolution only: never on eval, tasks, callbacks, distributed or commands.
"""

from wide.io.adapters import (
    ADAPTERS,
    Adapter,
    inject_adapter,
    is_adapter_name,
    merge_adapters,
    read_adapters,
    register_adapter,
)
from wide.io.checkpoint import (
    check_identity,
    is_trained_name,
    load_trained,
    model_identity,
    read_metadata,
    save_trained,
    trained_state,
)
from wide.io.folder import export, load
from wide.io.loading import LoadedModel, describe_routing, load_model, resolve_device, resolve_dtype

__all__ = [
    "ADAPTERS",
    "Adapter",
    "LoadedModel",
    "check_identity",
    "describe_routing",
    "export",
    "inject_adapter",
    "is_adapter_name",
    "is_trained_name",
    "load",
    "load_model",
    "load_trained",
    "merge_adapters",
    "model_identity",
    "read_adapters",
    "read_metadata",
    "register_adapter",
    "resolve_device",
    "resolve_dtype",
    "save_trained",
    "trained_state",
]
