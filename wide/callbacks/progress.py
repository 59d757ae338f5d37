"""Progress a person can read: optimizer steps out of the run's total, seconds per step, tokens/s and ETA.

Lightning's bars count batches per epoch (``Epoch 0/-2`` for a step-based run, whose epochs are unbounded) and
print nothing useful into a log file. ``StepProgress`` keeps Lightning's tqdm bar on a terminal, counting steps
of the whole run; when stdout is not a terminal it prints plain lines instead.
"""

from __future__ import annotations

import math
import sys
import time
from collections import deque
from typing import Any, Optional

import lightning as L
from lightning.pytorch.callbacks import TQDMProgressBar

__all__ = ["StepProgress", "is_last_step", "total_steps"]


def total_steps(trainer: L.Trainer) -> Optional[int]:
    """Optimizer steps the run ends at (``max_steps``, or epochs × batches), ``None`` when unbounded."""
    total = trainer.estimated_stepping_batches
    return None if total is None or math.isinf(total) else int(total)


def is_last_step(trainer: L.Trainer) -> bool:
    """Whether the optimizer step just taken ends the run (its step budget, or a stop request)."""
    total = total_steps(trainer)
    return trainer.should_stop or (total is not None and trainer.global_step >= total)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


class StepProgress(TQDMProgressBar):
    """Steps done / total, s/step, tokens/s (all ranks) and ETA; a validation summary line after each validation.

    On a terminal this is Lightning's tqdm bar over the whole run's optimizer steps; otherwise (a log file, a
    pipe) one plain line every ``every_n_steps`` steps and at least every ``every_n_seconds``.

    Args:
        every_n_steps: Plain-line cadence in steps; ``None``: about every 5% of the run.
        every_n_seconds: A plain line also when this long passed since the last one (slow steps).
        plain: Force plain lines (``True``) or the bar (``False``); ``None``: plain when stdout is not a terminal.
        window: Steps the rates and the ETA average over.
    """

    def __init__(self, every_n_steps: Optional[int] = None, every_n_seconds: float = 60.0,
                 plain: Optional[bool] = None, window: int = 20, refresh_rate: int = 1):
        super().__init__(refresh_rate=refresh_rate)
        if every_n_steps is not None and not (isinstance(every_n_steps, int) and every_n_steps > 0):
            raise ValueError(f"every_n_steps: must be a positive integer or None, got {every_n_steps!r}")
        if not (isinstance(window, int) and window >= 1):
            raise ValueError(f"window: must be an integer >= 1, got {window!r}")
        self.every_n_steps = every_n_steps
        self.every_n_seconds = every_n_seconds
        self.plain = (not sys.stdout.isatty()) if plain is None else plain
        self._marks: deque[tuple[float, int, int]] = deque(maxlen=window + 1)  # (time, step, tokens so far)
        self._tokens = 0
        self._last_line = 0.0
        self._start_step = self._said_step = 0

    @property
    def is_disabled(self) -> bool:
        return super().is_disabled or self.plain  # plain mode keeps the hooks but draws no bar

    # ------------------------------------------------------------------------------------ rates
    def rates(self) -> dict[str, float]:
        """``s_per_step`` and ``tokens_per_s`` over the window, and ``eta_s`` (when the total is known)."""
        if len(self._marks) < 2:
            return {}
        (t0, s0, n0), (t1, s1, n1) = self._marks[0], self._marks[-1]
        if s1 <= s0 or t1 <= t0:
            return {}
        out = {"s_per_step": (t1 - t0) / (s1 - s0), "tokens_per_s": (n1 - n0) / (t1 - t0)}
        total = total_steps(self.trainer)
        if total is not None:
            out["eta_s"] = max(0, total - s1) * out["s_per_step"]
        return out

    def get_metrics(self, trainer: L.Trainer, pl_module: Any) -> dict[str, Any]:
        items = super().get_metrics(trainer, pl_module)
        items.pop("v_num", None)
        items.pop("perf/tokens_per_s", None)  # the bar shows its own, over the same steps as its ETA
        tps = self.rates().get("tokens_per_s")
        shown = {"tok/s": f"{tps:,.0f}"} if tps else {}
        return {**shown, **{k.removeprefix("train/"): v for k, v in items.items()}}

    # ---------------------------------------------------------------------------------- training
    def init_train_tqdm(self):
        bar = super().init_train_tqdm()
        bar.set_description("step")
        return bar

    def on_train_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        super().on_train_start(trainer, pl_module)
        total = total_steps(trainer)
        self.train_progress_bar.reset(total=total)
        self.train_progress_bar.initial = trainer.global_step  # a resumed run starts where it stopped
        self.train_progress_bar.n = trainer.global_step
        self._marks.clear()
        self._marks.append((time.perf_counter(), trainer.global_step, 0))
        self._tokens = 0
        self._last_line = time.perf_counter()
        self._start_step = self._said_step = trainer.global_step
        if self.plain and self.is_enabled:
            self._say(f"wide: training steps {trainer.global_step + 1}-{total if total is not None else '?'}")

    def on_train_epoch_start(self, trainer: L.Trainer, *_: Any) -> None:
        pass  # one bar over the run's steps, not one per epoch

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        ids = batch.get("input_ids") if isinstance(batch, dict) else None
        self._tokens += (ids.numel() if ids is not None else 0) * trainer.world_size
        step = trainer.global_step
        if not self._marks or step != self._marks[-1][1]:  # gradient accumulation: only whole steps count
            self._marks.append((time.perf_counter(), step, self._tokens))
        if self.plain:
            if self.is_enabled and self._line_due(trainer, step):
                self._said_step = step
                self._say(self._train_line(trainer, pl_module, step))
            return
        if self._should_update(step, self.train_progress_bar.total or 0):
            self.train_progress_bar.n = step
            self.train_progress_bar.refresh()
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        if not self.train_progress_bar.disable:
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))

    def _line_due(self, trainer: L.Trainer, step: int) -> bool:
        if step == self._said_step:
            return False  # no whole step since the last line (gradient accumulation)
        total = total_steps(trainer)
        every = self.every_n_steps or max(1, round((total or 100) / 20))
        return (step % every == 0 or step == self._start_step + 1 or is_last_step(trainer)
                or time.perf_counter() - self._last_line >= self.every_n_seconds)

    def _train_line(self, trainer: L.Trainer, pl_module: Any, step: int) -> str:
        total = total_steps(trainer)
        parts = [f"step {step}/{total}" + (f" ({100 * step / total:.0f}%)" if total else "")
                 if total is not None else f"step {step}"]
        rates = self.rates()
        if rates:
            parts += [f"{rates['s_per_step']:.2f} s/step", f"{rates['tokens_per_s']:,.0f} tok/s"]
            if "eta_s" in rates:
                parts.append(f"ETA {_duration(rates['eta_s'])}")
        metrics = super().get_metrics(trainer, pl_module)
        shown = [f"{k.removeprefix('train/')} {v:.4g}" if isinstance(v, float) else f"{k.removeprefix('train/')} {v}"
                 for k, v in metrics.items() if k.startswith("train/")]
        return "wide: " + " | ".join(parts + shown)

    def _say(self, line: str) -> None:
        self._last_line = time.perf_counter()
        print(line, flush=True)

    # --------------------------------------------------------------------------------- validation
    def on_validation_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        super().on_validation_end(trainer, pl_module)
        if trainer.sanity_checking or not self.is_enabled:
            return
        metrics = {k: v for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        if not metrics:
            return
        where = f" at step {trainer.global_step}" if trainer.state.fn == "fit" else ""
        text = " | ".join(f"{k} {float(v):.4g}" for k, v in sorted(metrics.items()))
        line = f"wide: validation{where}: {text}"
        if self.plain:
            self._say(line)
        else:
            self.print(line)
        if self._marks:  # validation time is not training time: restart the rate window
            now = time.perf_counter()
            self._marks.clear()
            self._marks.append((now, trainer.global_step, self._tokens))
