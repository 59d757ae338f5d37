"""Writes the trained tensors (routers, LoRA) as safetensors, and Lightning's ``last.ckpt`` for resuming."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Optional

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info

from wide.distributed import gather_trained_state
from wide.io.checkpoint import check_finite, save_trained


class WideCheckpoint(ModelCheckpoint):
    """Saves ``routers.safetensors`` (the last state), numbered copies, and ``last.ckpt`` to resume from.

    Every ``every_n_steps`` optimizer steps (and at the end of training) the router / LoRA tensors are
    gathered from all ranks (FSDP2 shards them) and rank 0 writes ``routers.safetensors`` plus a
    ``step-XXXXXX.safetensors`` copy. At the same cadence Lightning's ``last.ckpt`` (trained tensors,
    optimizer, LR schedule, loop and data-order state; no backbone) is written next to them, so
    ``wide fit ... --ckpt_path last`` resumes at the same step. All files are written to a temporary name
    and renamed, and nothing is written when a trained tensor is NaN or inf, so the last good files
    survive a crash or a numerical blow-up.

    Args:
        dirpath: Output folder; ``None`` puts it in the run's log folder (``<log_dir>/wide``), which
            changes with every run version, so resuming with ``--ckpt_path last`` needs a fixed folder.
        every_n_steps: Cadence in optimizer steps of the numbered copies and of ``last.ckpt``
            (0: only at the end of training, and ``last.ckpt`` after each validation).
        save_resume: Also write ``last.ckpt`` (Lightning's resume checkpoint).
        overwrite: Let ``fit`` replace the results of an earlier run in ``dirpath`` (``wide fit --overwrite``);
            otherwise such a fit refuses before any compute, unless it resumes from that folder's ``last.ckpt``.
    """

    FILENAME = "routers.safetensors"

    def __init__(self, dirpath: Optional[str] = None, every_n_steps: int = 0, save_resume: bool = True,
                 overwrite: bool = False):
        if not isinstance(every_n_steps, int) or every_n_steps < 0:
            raise ValueError(f"every_n_steps: must be an integer >= 0, got {every_n_steps!r}")
        super().__init__(dirpath=dirpath, save_last=True if save_resume else None, save_top_k=0,
                         every_n_train_steps=every_n_steps or None, enable_version_counter=False)
        self.every_n_steps = every_n_steps
        self.save_resume = save_resume
        self.overwrite = overwrite
        self.last_path: Optional[Path] = None

    def resolve_dir(self, trainer: L.Trainer) -> Path:
        if self.dirpath is not None:
            return Path(self.dirpath)
        return Path(trainer.log_dir or trainer.default_root_dir) / "wide"

    def earlier_results(self) -> list[str]:
        """Names of an earlier run's results in a fixed ``dirpath`` (none when the folder is per run version)."""
        if self.dirpath is None or not Path(self.dirpath).is_dir():
            return []
        names = sorted(p.name for p in Path(self.dirpath).iterdir()
                       if p.name in (self.FILENAME, "last.ckpt") or p.name.startswith("step-"))
        return names

    def resumes_here(self, ckpt_path: Optional[str]) -> bool:
        """Whether ``ckpt_path`` resumes from this folder's own checkpoint (``last`` or a file in ``dirpath``)."""
        if ckpt_path is None or ckpt_path in ("best", "hpc", "registry") or self.dirpath is None:
            return False
        return ckpt_path == "last" or Path(ckpt_path).resolve().parent == Path(self.dirpath).resolve()

    def check_fresh(self, ckpt_path: Optional[str]) -> None:
        """Refuses (``ValueError``) to let a fit overwrite an earlier run's results, unless told to or resuming
        from this folder's own ``last.ckpt``."""
        found = self.earlier_results()
        if not found or self.overwrite or self.resumes_here(ckpt_path):
            return
        shown = ", ".join(found[:3]) + (", ..." if len(found) > 3 else "")
        raise ValueError(f"wide_checkpoint.dirpath: {self.dirpath} already holds an earlier run's results ({shown}); "
                         "pass --overwrite to replace them, --ckpt_path last to resume that run, or another "
                         "--wide_checkpoint.dirpath")

    def setup(self, trainer: L.Trainer, pl_module, stage: str) -> None:
        if self.dirpath is None:
            self.dirpath = str(trainer.strategy.broadcast(self.resolve_dir(trainer)))
        super().setup(trainer, pl_module, stage)

    # --------------------------------------------------------------------------------- safetensors
    def save(self, trainer: L.Trainer, pl_module, *names: str) -> Optional[Path]:
        """Writes the trained tensors under each of ``names`` (collective: call it on every rank)."""
        model = getattr(pl_module, "model", None)
        if model is None:
            return None
        state = gather_trained_state(model)
        # every rank holds the same full tensors, so all ranks fail together, before anything is written
        check_finite(state, trainer.global_step, self.resolve_dir(trainer) / self.FILENAME)
        path = None
        if trainer.is_global_zero:
            for name in names:
                path = save_trained(model, self.resolve_dir(trainer) / name, config=pl_module.routing,
                                    stage=pl_module.stage, step=trainer.global_step, state=state,
                                    identity=getattr(pl_module, "identity", None),
                                    extra={"model": pl_module.model_name, **getattr(pl_module, "checkpoint_extra", dict)()})
        trainer.strategy.barrier("wide_checkpoint")
        return path

    def on_train_start(self, trainer: L.Trainer, pl_module) -> None:
        # `wide fit` checks before any compute (WideCLI); this is for Trainers built in Python, the first hook
        # that knows the resume path, still before anything is written
        self.check_fresh(trainer.ckpt_path)
        if self.overwrite and not self.resumes_here(trainer.ckpt_path) and trainer.is_global_zero:
            for name in self.earlier_results():  # no numbered copies of the earlier run left among the new ones
                path = Path(self.dirpath) / name
                shutil.rmtree(path) if path.is_dir() else path.unlink()  # a sharded last.ckpt is a folder
        trainer.strategy.barrier("wide_checkpoint_fresh")
        super().on_train_start(trainer, pl_module)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        step = trainer.global_step
        if self.every_n_steps and step > 0 and step % self.every_n_steps == 0:
            path = self.save(trainer, pl_module, f"step-{step:06d}.safetensors", self.FILENAME)
            self.last_path = path or self.last_path
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_train_end(self, trainer: L.Trainer, pl_module) -> None:
        path = self.save(trainer, pl_module, self.FILENAME)
        if path is not None:
            self.last_path = path
            rank_zero_info(f"wide: trained tensors written to {path}")
        if (self.save_resume and not self._should_skip_saving_checkpoint(trainer)
                and self._last_global_step_saved != trainer.global_step):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))  # the final state, to extend a run
        super().on_train_end(trainer, pl_module)

    # ---------------------------------------------------------------------------------- last.ckpt
    def _save_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        # Lightning writes in place (or via a temp file elsewhere, copied across file systems); write
        # next to the target and rename, so `last.ckpt` is always a whole checkpoint
        tmp = f"{filepath}.tmp"
        super()._save_checkpoint(trainer, tmp)
        trainer.strategy.barrier("wide_checkpoint_ckpt")
        if trainer.is_global_zero:
            _replace(tmp, filepath)
        trainer.strategy.barrier("wide_checkpoint_ckpt_renamed")
        self._last_checkpoint_saved = filepath


def _replace(src: str, dst: str) -> None:
    if os.path.isdir(src):  # a sharded (distributed) checkpoint is a folder
        old = f"{dst}.old"
        if os.path.lexists(dst):
            os.replace(dst, old)
        os.replace(src, dst)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(src, dst)
