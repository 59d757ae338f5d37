"""Fault injectors for the reliability tests, added to a run as ``--trainer.callbacks`` class paths."""

from __future__ import annotations

import os

import lightning as L
import torch


class HardExit(L.Callback):
    """Kills the process when step ``at_step`` starts: ``os._exit``, no cleanup or teardown, like SIGKILL."""

    def __init__(self, at_step: int):
        self.at_step = at_step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        if trainer.global_step == self.at_step:
            os._exit(137)


class PoisonRouters(L.Callback):
    """Sets one router weight to NaN at step ``at_step``: before the forward (``where='forward'``: NaN loss)
    or after the optimizer step (``where='weights'``: finite loss, NaN weights reach the checkpoint)."""

    def __init__(self, at_step: int, where: str = "forward"):
        self.at_step, self.where = at_step, where

    def _poison(self, pl_module) -> None:
        name, p = next((n, p) for n, p in pl_module.model.named_parameters() if ".wide.routers." in f".{n}")
        with torch.no_grad():
            p.view(-1)[0] = float("nan")

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        if self.where == "forward" and trainer.global_step == self.at_step:
            self._poison(pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if self.where == "weights" and trainer.global_step == self.at_step:
            self._poison(pl_module)
