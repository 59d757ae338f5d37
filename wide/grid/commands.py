"""The `wide fit` and `wide eval` command lines of one grid cell."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from wide.grid.spec import Cell, GridSpec, config_value, effective_config, routing_dict


def cli_value(value: Any) -> str:
    """A Python value as LightningCLI (jsonargparse) reads it from the command line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


def model_name(spec: GridSpec, cell: Cell) -> str:
    from wide.io.loading import DEFAULT_MODEL

    return str(config_value(effective_config(spec, cell, "calibrate"), "model.init_args.model", DEFAULT_MODEL))


def lora_alpha(spec: GridSpec, cell: Cell) -> float:
    from wide.io.adapters import DEFAULT_LORA_ALPHA

    return float(config_value(effective_config(spec, cell, "lora"), "model.init_args.lora_alpha", DEFAULT_LORA_ALPHA))


def fit_argv(spec: GridSpec, cell: Cell, stage: str, run_dir: Path, router_checkpoint: Optional[Path] = None) -> list[str]:
    """``wide fit`` arguments of one stage: base recipe, overrides, and outputs redirected into ``run_dir``.

    Logs go to ``run_dir/logs/version_0`` (TensorBoard + CSV, replacing the recipe's loggers) and the
    trained tensors to ``run_dir/routers.safetensors``.
    """
    base = spec.base if stage == "calibrate" else spec.lora_base
    if base is None:
        raise ValueError(f"cell {cell.name}: stage {stage} needs the grid's lora_base recipe")
    argv = ["fit", "--config", str(base)]
    full_routing = stage == "lora" and router_checkpoint is None
    for key, value in cell.cli_overrides(stage).items():
        if full_routing and key.startswith("model.init_args.routing."):
            continue  # the whole effective routing is passed below
        argv += [f"--{key}", cli_value(value)]
    if router_checkpoint is not None:
        argv += ["--model.init_args.router_checkpoint", str(router_checkpoint)]
    elif full_routing:  # no stage 1 (skip_calibration): LoRA starts from the cell's full routing
        argv += ["--model.init_args.router_checkpoint", "null",
                 "--model.init_args.routing", json.dumps(routing_dict(spec, cell))]
    loggers = [
        {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
         "init_args": {"save_dir": str(run_dir), "name": "logs", "version": 0, "default_hp_metric": False}},
        {"class_path": "lightning.pytorch.loggers.CSVLogger",
         "init_args": {"save_dir": str(run_dir), "name": "logs", "version": 0}},
    ]
    argv += ["--trainer.logger", json.dumps(loggers), "--trainer.default_root_dir", str(run_dir),
             "--wide_checkpoint.dirpath", str(run_dir)]
    return argv


def eval_argv(spec: GridSpec, cell: Cell, output: Path, checkpoint: Optional[Path] = None,
              alpha: Optional[float] = None) -> list[str]:
    """``wide eval`` arguments of a cell: its model and routing (or checkpoint) plus the eval options."""
    argv = ["eval", "--model", model_name(spec, cell)]
    if checkpoint is not None:
        argv += ["--checkpoint", str(checkpoint)]
        if alpha is not None:
            argv += ["--lora-alpha", repr(float(alpha))]
    else:
        routing = routing_dict(spec, cell)
        if routing is not None:
            argv += ["--routing", json.dumps(routing, sort_keys=True)]
    options = {**spec.eval, **cell.eval_overrides()}
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            argv.append(flag)
        elif key == "task_data":
            for task, folder in dict(value).items():
                argv += [flag, f"{task}={folder}"]
        elif isinstance(value, (list, tuple)):
            argv += [flag, ",".join(str(v) for v in value)]
        else:
            argv += [flag, str(value)]
    # the grid decides when a cell's eval runs again (settings changed, --force): replace its old results then
    argv += ["--output", str(output), "--quiet", "--force"]
    return argv
