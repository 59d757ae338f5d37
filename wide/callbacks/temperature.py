"""Gumbel-softmax temperature annealing."""

from __future__ import annotations

import lightning as L

import wide


class TemperatureSchedule(L.Callback):
    """Anneals the routers' Gumbel temperature from ``start`` to ``end`` over training.

    The temperature is a function of the global step, so a resumed run continues the same schedule.

    Args:
        start: Temperature at step 0.
        end: Temperature at the last step.
        mode: ``linear`` or ``exponential`` interpolation.
    """

    def __init__(self, start: float = 5.0, end: float = 0.5, mode: str = "linear"):
        if not (start > 0 and end > 0):
            raise ValueError(f"start/end: temperatures must be > 0, got {start!r}, {end!r}")
        if mode not in ("linear", "exponential"):
            raise ValueError(f"mode: must be 'linear' or 'exponential', got {mode!r}")
        self.start, self.end, self.mode = start, end, mode

    def value(self, step: int, total: int) -> float:
        frac = min(1.0, step / max(1, total - 1))
        if self.mode == "linear":
            return self.start + (self.end - self.start) * frac
        return self.start * (self.end / self.start) ** frac

    def on_train_batch_start(self, trainer: L.Trainer, pl_module, batch, batch_idx: int) -> None:
        total = max(1, int(trainer.estimated_stepping_batches))
        wide.set_temperature(pl_module.model, self.value(trainer.global_step, total))
