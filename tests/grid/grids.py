"""Tiny grid files for the grid tests: a 2-layer random model, a small local corpus, 2 training steps."""

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
SMOL = ROOT / "recipes" / "smollm2-135m"


def tiny_overrides(model_dir, corpus):
    return {
        "model.init_args.model": model_dir,
        "model.init_args.routing.attn_group_size": 2,
        "model.init_args.routing.ffn_group_size": 32,
        "data.source": corpus, "data.seq_len": 32, "data.batch_size": 2, "data.max_val_tokens": 256,
        "trainer.accelerator": "cpu", "trainer.devices": 1, "trainer.precision": "32-true",
        "trainer.max_steps": 2, "trainer.val_check_interval": 2, "trainer.limit_val_batches": 1,
        "trainer.enable_progress_bar": False, "trainer.enable_model_summary": False,
        "wide_checkpoint.every_n_steps": 0, "sparsity_monitor.heatmap_every_n_steps": 0,
    }


def write_grid(path, model_dir, corpus, axes, lora=False, **extra):
    grid = {"base": str(SMOL / "calibrate.yaml"), "output": str(path.parent / "out"),
            "overrides": tiny_overrides(model_dir, corpus),
            "eval": {"tasks": "all", "limit": 2, "ppl_window": 32, "batch_size": 4, "device": "cpu"},
            "axes": axes, **extra}
    if lora:
        grid["lora_base"] = str(SMOL / "lora.yaml")
        grid["overrides"]["lora.model.init_args.lora_r"] = 4
    path.write_text(yaml.safe_dump(grid, sort_keys=False))
    return path


def set_eval(path, **evals):
    """Replaces the grid file's ``eval`` options."""
    grid = yaml.safe_load(path.read_text())
    grid["eval"] = evals
    path.write_text(yaml.safe_dump(grid))
    return path


METHOD_X_SPARSITY = [
    {"name": "method", "values": {"topk": {"fit": False, "model.init_args.routing.router": "topk"},
                                  "wide": {"model.init_args.routing.router": "lowrank"}}},
    {"name": "target", "key": "model.init_args.routing.sparsity", "values": [0.25, 0.5]},
]
