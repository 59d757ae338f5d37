"""Realized-sparsity logging: per layer and kind, per token, and a token × layer heatmap."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import lightning as L
import torch
from torchmetrics import MeanMetric

import wide
from wide.callbacks.progress import is_last_step


class SparsityMonitor(L.Callback):
    """Logs what the routers actually skip.

    Training (every ``log_every_n_steps``, the Trainer's logging cadence): ``sparsity/train/{attn,ffn}/layer_XX``
    scalars, ``sparsity/train/total`` (the training target's rate: kinds averaged equally) and
    ``sparsity/train/by_weight`` (the share of routed weight work skipped, which speed follows; means over
    data-parallel ranks, one all-reduce), and a histogram of
    each valid token's active width (TensorBoard; rank 0's tokens).
    Validation: the same per-layer rates averaged over the whole validation set (weighted by valid
    tokens, reduced across ranks), logged at epoch end. Every ``heatmap_every_n_steps`` a token × layer
    heatmap of the active fraction of one training sequence goes to the logger and to
    ``<log_dir>/heatmaps/step_XXXXXX.png``, and one more at the last step of the run.

    Args:
        heatmap_every_n_steps: Heatmap cadence in optimizer steps (0: never).
        log_per_layer: Log one scalar per layer and kind (``False``: only totals).
    """

    def __init__(self, heatmap_every_n_steps: int = 100, log_per_layer: bool = True):
        if heatmap_every_n_steps < 0:
            raise ValueError(f"heatmap_every_n_steps: must be >= 0, got {heatmap_every_n_steps!r}")
        self.heatmap_every_n_steps = heatmap_every_n_steps
        self.log_per_layer = log_per_layer
        self._val: dict[str, MeanMetric] = {}
        self.heatmaps: list[Path] = []

    # -------------------------------------------------------------------------------------- train
    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        stats = wide.sparsity_stats(pl_module.model)
        if stats is None:
            return
        step = trainer.global_step
        if step % max(1, trainer.log_every_n_steps) == 0:
            self._log_rates(trainer, pl_module, stats, "train", batch["input_ids"].shape[0])
            self._histogram(trainer, stats, step)
        # every run, however short, ends with one (its last step, or a stop request)
        if self.heatmap_every_n_steps and (step % self.heatmap_every_n_steps == 0 or is_last_step(trainer)):
            if not self.heatmaps or self.heatmaps[-1].name != f"step_{step:06d}.png":
                self._heatmap(trainer, stats, step)

    def _log_rates(self, trainer: L.Trainer, pl_module, stats: "wide.SparsityStats", split: str,
                   batch_size: int) -> None:
        rates = {"total": stats.realized(), "by_weight": stats.realized_by_weight()}
        for kind in stats.kinds:
            rates[kind] = stats.realized(kind)
            if self.log_per_layer:
                for i, layer in enumerate(stats.layers):
                    rates[f"{kind}/layer_{layer:02d}"] = stats.skip[kind][i]
        values = torch.stack([v.detach().float().reshape(()) for v in rates.values()])
        if trainer.world_size > 1:  # one all-reduce for all of them: the mean over data-parallel ranks
            values = trainer.strategy.reduce(values, reduce_op="mean")
        for name, value in zip(rates, values):
            pl_module.log(f"sparsity/{split}/{name}", value, batch_size=batch_size)

    def _histogram(self, trainer: L.Trainer, stats: "wide.SparsityStats", step: int) -> None:
        active = stats.token_active_mean()
        if stats.valid is not None:
            active = active[stats.valid]
        for logger in trainer.loggers:
            exp = getattr(logger, "experiment", None)
            if hasattr(exp, "add_histogram"):
                exp.add_histogram("sparsity/train/token_active_width", active.detach().float().cpu(), step)

    def _heatmap(self, trainer: L.Trainer, stats: "wide.SparsityStats", step: int) -> Optional[Path]:
        # every rank reads trainer.log_dir: it broadcasts from rank 0 (a collective; rank 0 alone would hang)
        folder = Path(trainer.log_dir or trainer.default_root_dir) / "heatmaps"
        if not trainer.is_global_zero:
            return None
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        grid = torch.stack([t[0] for t in stats.token_active.values()]).mean(0).float().cpu()  # [T, L]
        if stats.valid is not None:
            grid = grid[stats.valid[0].cpu()]
        fig, ax = plt.subplots(figsize=(min(16, 2 + grid.shape[0] / 16), 2 + grid.shape[1] / 6))
        im = ax.imshow(grid.t().numpy(), aspect="auto", cmap="viridis", vmin=0, vmax=1, origin="lower")
        ax.set_xlabel("token")
        ax.set_ylabel("routed layer")
        ax.set_yticks(range(len(stats.layers)), [str(i) for i in stats.layers], fontsize=6)
        ax.set_title(f"active width per token and layer, step {step}")
        fig.colorbar(im, ax=ax, label="active fraction")
        fig.tight_layout()
        out = folder / f"step_{step:06d}.png"
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=100)
        for logger in trainer.loggers:
            exp = getattr(logger, "experiment", None)
            if hasattr(exp, "add_figure"):
                exp.add_figure("sparsity/train/heatmap", fig, step)
        plt.close(fig)
        self.heatmaps.append(out)
        return out

    # --------------------------------------------------------------------------------- validation
    def _metric(self, pl_module, key: str) -> MeanMetric:
        if key not in self._val:
            self._val[key] = MeanMetric().to(pl_module.device)
        return self._val[key]

    def on_validation_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int,
                                dataloader_idx: int = 0) -> None:
        if trainer.sanity_checking:
            return
        stats = wide.sparsity_stats(pl_module.model)
        if stats is None:
            return
        n = stats.valid.sum() if stats.valid is not None else torch.tensor(float(batch["input_ids"].numel()))
        self._metric(pl_module, "by_weight").update(stats.realized_by_weight(), weight=n)
        for kind in stats.kinds:
            self._metric(pl_module, kind).update(stats.realized(kind), weight=n)
            if self.log_per_layer:
                for i, layer in enumerate(stats.layers):
                    self._metric(pl_module, f"{kind}/layer_{layer:02d}").update(stats.skip[kind][i], weight=n)

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module) -> None:
        if trainer.sanity_checking or not self._val:
            return
        kinds = [k for k in self._val if "/" not in k and k != "by_weight"]
        totals = {k: self._val[k].compute() for k in kinds}
        # MeanMetric.compute() already reduces over ranks; sync_dist only keeps Lightning's bookkeeping exact
        pl_module.log("sparsity/val/total", torch.stack(list(totals.values())).mean(), sync_dist=True)
        for key, metric in self._val.items():
            pl_module.log(f"sparsity/val/{key}", metric.compute(), sync_dist=True)
            metric.reset()
