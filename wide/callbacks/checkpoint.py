"""Writes only the trained tensors (routers, LoRA) as safetensors, with the config and model identity."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import lightning as L
from lightning.pytorch.utilities import rank_zero_info

from wide.checkpoint import save_trained


class WideCheckpoint(L.Callback):
    """Saves ``routers.safetensors`` (the last state) and, every ``every_n_steps``, ``step-XXXXXX.safetensors``.

    Files go to ``dirpath`` (default: ``<trainer.log_dir>/wide``) and are written atomically, so the
    last good file survives a crash or a non-finite loss.

    Args:
        dirpath: Output folder; ``None`` puts it in the run's log folder.
        every_n_steps: Also keep a numbered copy every this many optimizer steps (0: never).
    """

    FILENAME = "routers.safetensors"

    def __init__(self, dirpath: Optional[str] = None, every_n_steps: int = 0):
        if every_n_steps < 0:
            raise ValueError(f"every_n_steps: must be >= 0, got {every_n_steps!r}")
        self.dirpath = dirpath
        self.every_n_steps = every_n_steps
        self.last_path: Optional[Path] = None

    def resolve_dir(self, trainer: L.Trainer) -> Path:
        if self.dirpath is not None:
            return Path(self.dirpath)
        return Path(trainer.log_dir or trainer.default_root_dir) / "wide"

    def save(self, trainer: L.Trainer, pl_module, name: str) -> Optional[Path]:
        model = getattr(pl_module, "model", None)
        if model is None:
            return None
        if not trainer.is_global_zero:
            return None
        path = save_trained(model, self.resolve_dir(trainer) / name, config=pl_module.routing,
                            stage=pl_module.stage, step=trainer.global_step,
                            extra={"model": pl_module.model_name})
        return path

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        step = trainer.global_step
        if self.every_n_steps and step > 0 and step % self.every_n_steps == 0 and trainer.is_global_zero:
            self.save(trainer, pl_module, f"step-{step:06d}.safetensors")
            self.last_path = self.save(trainer, pl_module, self.FILENAME)

    def on_train_end(self, trainer: L.Trainer, pl_module) -> None:
        path = self.save(trainer, pl_module, self.FILENAME)
        if path is not None:
            self.last_path = path
            rank_zero_info(f"wide: trained tensors written to {path}")
