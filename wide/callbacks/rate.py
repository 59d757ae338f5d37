"""Sets the trained routers' noise-free skip rate to the target at the end of a fit (`wide.modeling.fit_rate`)."""

from __future__ import annotations

from typing import Any, Optional

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info

import wide
from wide.callbacks.progress import is_last_step


class RateCalibration(L.Callback):
    """After the last training step, shifts every router's execute margins by one amount so that the eval decision
    (argmax, no Gumbel noise) realizes the target rate on held-out batches (`wide.modeling.rate.fit_rate`).

    The sparsity term trains the mean of noisy hard samples to the target, which the noise-free decision misses
    (low targets come out low, high ones high; see `wide.modeling.rate`). The shift runs once, before the run's
    last validation and before the trained tensors are written, so both see the calibrated routers; it logs
    ``rate_fit/{before,after,target,shift}`` and one ``wide: rate calibration ...`` line. Routers without a threshold
    (top-k, random, fixed masks) are left as they are.

    Args:
        enabled: Run it (``false`` keeps the routers exactly as trained).
        batches: Batches to measure on per rank: the validation split's first ones (dealt over the ranks), else the
            training split's when there is no held-out split.
        tolerance: Allowed ``|realized - target|`` of the rate the target measures (``sparsity_measure``).
        max_passes: At most this many forward passes over the batches.
    """

    def __init__(self, enabled: bool = True, batches: int = 8, tolerance: float = 0.002, max_passes: int = 40):
        if not (isinstance(batches, int) and batches >= 1):
            raise ValueError(f"batches: must be a positive integer, got {batches!r}")
        if not 0 < tolerance < 0.5:
            raise ValueError(f"tolerance: must be in (0, 0.5), got {tolerance!r}")
        if not (isinstance(max_passes, int) and max_passes >= 2):
            raise ValueError(f"max_passes: must be an integer >= 2, got {max_passes!r}")
        self.enabled, self.batches, self.tolerance, self.max_passes = enabled, batches, tolerance, max_passes
        self.result: Optional["wide.modeling.rate.RateFit"] = None
        self._done_at: Optional[int] = None

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if is_last_step(trainer):  # before the last validation (the task asks for it at this step)
            self.calibrate(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module) -> None:
        self.calibrate(trainer, pl_module)  # a run stopped otherwise (max_time, ...); WideCheckpoint writes after this

    def calibrate(self, trainer: L.Trainer, pl_module) -> None:
        """Runs the shift once per step (collective: every rank calls it)."""
        model = getattr(pl_module, "model", None)
        if not self.enabled or model is None or self._done_at == trainer.global_step or not wide.is_routed(model):
            return
        self._done_at = trainer.global_step
        batches, split = self._batches(trainer)
        if not batches:
            rank_zero_info("wide: rate calibration skipped: no batch to measure on")
            return
        from wide.modeling.rate import fit_rate

        def reduce(values: torch.Tensor) -> torch.Tensor:
            return trainer.strategy.reduce(values, reduce_op="sum") if trainer.world_size > 1 else values

        with trainer.precision_plugin.forward_context():
            fit = fit_rate(model, batches, pl_module.routing, tolerance=self.tolerance, max_passes=self.max_passes,
                           reduce=reduce)
        if fit is None:
            rank_zero_info("wide: rate calibration skipped: no router has a threshold to shift (top-k, random, ...)")
            return
        self.result = fit
        warn = "" if fit.max_error() <= self.tolerance else f" (off by {fit.max_error():.4f}: more batches may help)"
        rank_zero_info(f"wide: rate calibration on {len(batches)} {split} batches per rank: {fit.describe()}{warn}")
        for logger in trainer.loggers:  # not pl_module.log: on_train_end may not log through it
            logger.log_metrics(fit.metrics(), step=trainer.global_step)

    def _batches(self, trainer: L.Trainer) -> tuple[list[dict[str, Any]], str]:
        loader, split = None, "held-out"
        datamodule = trainer.datamodule
        if datamodule is not None:
            loader = datamodule.val_dataloader()
            if isinstance(loader, (list, tuple)) and not loader:  # no held-out split
                loader, split = datamodule.train_dataloader(), "training"
        else:
            loader = trainer.val_dataloaders or trainer.train_dataloader
        if isinstance(loader, (list, tuple)):
            loader = loader[0] if loader else None
        if loader is None:
            return [], split
        world, rank = trainer.world_size, trainer.global_rank
        taken = []
        for batch in loader:
            if len(taken) == self.batches * world:
                break
            taken.append(batch)
        if len(taken) >= world:  # an unsharded loader: each rank its own batches, all as many
            taken = taken[:len(taken) // world * world][rank::world]
        return [trainer.strategy.batch_to_device(b) for b in taken], split
