"""Pre-flight checks: every bad input a run can be given fails here, with one clear error, before any compute.

Reads only the model's ``config.json`` (no weights): architecture, routing fit (group sizes, GQA
alignment, dense layers), ``seq_len`` against ``max_position_embeddings``, a stage-1 router checkpoint
against the model's shapes, and the Lightning strategy. ``WideCLI`` runs it before ``fit``; the task
runs it again in ``setup`` (it is cheap) for programmatic use.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Optional

from wide.config import WideConfig


def load_model_config(name: str):
    """The HF config of a model name, folder or asset (fetching the asset if needed and allowed)."""
    from transformers import AutoConfig

    from wide.assets import resolve_model

    path = resolve_model(name)
    try:
        return AutoConfig.from_pretrained(path)
    except (OSError, ValueError, KeyError) as err:
        raise ValueError(f"model: cannot read the config of {name!r} ({path}): {err}") from None


def check_routing(config, routing: WideConfig) -> None:
    """Architecture supported, and the routing fits every layer (what ``apply_wide`` checks, without weights)."""
    from wide.modeling.architectures import arch_for
    from wide.modeling.wrap import layer_shapes
    from wide.policies import POLICIES

    arch_for(config)
    shapes = layer_shapes(SimpleNamespace(config=config))
    n = len(shapes)
    for i in routing.dense_layers:
        if not -n <= i < n:
            raise ValueError(f"dense_layers: index {i} is out of range for {n} layers")
    policy = POLICIES.get(routing.granularity, field="granularity")()
    for shape in shapes:
        policy.validate(shape, routing)


def check_seq_len(config, seq_len: Optional[int], model_name: str) -> None:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    limit = getattr(text, "max_position_embeddings", None)
    if seq_len is not None and isinstance(limit, int) and seq_len > limit:
        raise ValueError(
            f"data.seq_len: {seq_len} exceeds the maximum sequence length of model {model_name!r} "
            f"(max_position_embeddings={limit})"
        )


def check_router_checkpoint(config, path: str) -> None:
    """A stage-1 checkpoint made for a model of other shapes fails before the model is loaded."""
    from wide.io.checkpoint import IDENTITY_FIELDS, check_identity_dicts, config_identity, read_metadata

    check_identity_dicts(read_metadata(path)["base_model"], config_identity(config), where="router_checkpoint",
                         fields=IDENTITY_FIELDS)


def read_resume_checkpoint(path: Any) -> Optional[dict[str, Any]]:
    """A ``--ckpt_path`` file, memory-mapped and loaded without unpickling code (``weights_only=True``).

    ``None`` for Lightning's names (``last``, ...) and for paths that are not files (Lightning reports those).
    """
    from pathlib import Path

    import torch

    if path is None or path in ("last", "best", "hpc", "registry") or not Path(path).is_file():
        return None
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()] or [type(err).__name__]
        first = next((line for line in lines if "Unsupported global" in line), lines[0])
        raise ValueError(f"ckpt_path: {path} cannot be loaded as plain tensors (weights_only=True), so it is "
                         f"refused: {first}") from None
    if not isinstance(ckpt, dict) or ckpt.get("wide") is None:
        raise ValueError(f"ckpt_path: {path} is not a wide resume checkpoint (no 'wide' entry); pass a last.ckpt "
                         "written by WideCheckpoint")
    return ckpt


def read_resume_file(path: Any) -> Optional[dict[str, Any]]:
    """The ``wide`` entry of a ``--ckpt_path`` file (see ``read_resume_checkpoint``), or ``None``."""
    ckpt = read_resume_checkpoint(path)
    return None if ckpt is None else ckpt["wide"]


# Task settings a resumed run may change: how it computes, not what it trains (the model itself is compared
# by identity: a moved folder is the same model); router_init / router_init_tokens only act at a fresh start (a
# resume keeps its trained routers), and stage-2 files written before LoRARecovery took them do not hold them
FREE_ON_RESUME = ("model", "router_checkpoint", "dtype", "attn_implementation", "gradient_checkpointing",
                  "fuse_glue", "loss.backend", "loss.chunk_size", "routing.backend", "router_init")


def _flat(values: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(values, dict):
        out: dict[str, Any] = {}
        for key, value in values.items():
            if not str(key).startswith("_"):  # LightningCLI's own entries (_class_path, _instantiator)
                out.update(_flat(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: values}


def check_resume_settings(saved: dict[str, Any], have: dict[str, Any]) -> None:
    """A resume continues the same run: every trained-for setting (routing, loss, lam, lr, ...) must match the
    checkpoint's. LightningCLI would silently replace the given ones by the checkpoint's; name them instead."""
    a, b = _flat(dict(saved)), _flat(dict(have))
    free = tuple(FREE_ON_RESUME)
    diffs = [f"{k}: checkpoint {a.get(k)!r} vs run {b.get(k)!r}" for k in sorted(set(a) | set(b))
             if a.get(k) != b.get(k) and not k.startswith(free)]
    if diffs:
        raise ValueError("ckpt_path: the checkpoint was trained with other settings, and a resume continues the same "
                         "run; " + "; ".join(diffs) + " (drop these overrides to resume, or start a new run)")


def check_resume_file(path: Any, stage: str, hparams: Optional[dict[str, Any]] = None, config: Any = None) -> None:
    """A ``--ckpt_path`` file must be a wide resume checkpoint of the same stage, settings and model shapes,
    loadable without pickle."""
    ckpt = read_resume_checkpoint(path)
    if ckpt is None:
        return
    info = ckpt["wide"]
    if info.get("stage") != stage:
        raise ValueError(
            f"ckpt_path: written by stage {info.get('stage')!r}, this run is stage {stage!r}; a resume checkpoint "
            "continues the same run (stage 2 starts from stage-1 routers via router_checkpoint)"
        )
    if hparams is not None:
        check_resume_settings(ckpt.get("hyper_parameters") or {}, hparams)
    if config is not None and info.get("identity"):
        import json

        from wide.io.checkpoint import IDENTITY_FIELDS, check_identity_dicts, config_identity

        check_identity_dicts(json.loads(info["identity"]), config_identity(config), where="ckpt_path",
                             fields=IDENTITY_FIELDS)


def preflight(task: Any, datamodule: Any = None, trainer: Any = None, ckpt_path: Any = None) -> None:
    """All checks for ``task`` (a ``WideTask``) with its datamodule and trainer; raises ``ValueError``."""
    if trainer is not None:
        from wide.distributed import FSDP2Strategy, check_strategy

        check_strategy(trainer.strategy)
        if getattr(task, "router_init", "random") == "importance" and isinstance(trainer.strategy, FSDP2Strategy):
            raise ValueError("router_init: 'importance' writes whole router weights, which FSDP2 shards; use one "
                             "device or ddp for this fit, or router_init: random")
    config = load_model_config(task.model_name)
    check_resume_file(ckpt_path, task.stage, dict(task.hparams), config)
    check_routing(config, task.routing)
    hparams = getattr(datamodule, "hparams", None)
    check_seq_len(config, getattr(hparams, "seq_len", None), task.model_name)
    router_checkpoint = getattr(task, "router_checkpoint", None)
    if router_checkpoint is not None:
        check_router_checkpoint(config, router_checkpoint)
