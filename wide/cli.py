"""The ``wide`` command.

``wide fit|validate|test`` run LightningCLI over a task (``model.class_path``: ``RouterCalibration``
or ``LoRARecovery``) and the text datamodule, in OmegaConf parser mode so recipes can interpolate.
Other subcommands (``assets``, and those later issues add) are plain argparse programs.
"""

from __future__ import annotations

import importlib
import sys
from typing import Callable, Optional

from lightning.pytorch.cli import LightningCLI

# name -> "module:function" taking argv; imported lazily so `wide fit` does not pay for them
SUBCOMMANDS: dict[str, str] = {
    "assets": "wide.assets:assets_main",
    "bench": "wide.bench:bench_main",
    "eval": "wide.eval.cli:eval_main",
    "grid": "wide.grid:grid_main",
}

TRAINER_DEFAULTS = {
    "logger": [
        {"class_path": "lightning.pytorch.loggers.TensorBoardLogger", "init_args": {"save_dir": "runs", "name": "wide"}},
        {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": "runs", "name": "wide"}},
    ],
    "log_every_n_steps": 5,
}


class WideCLI(LightningCLI):
    """LightningCLI with the routing callbacks always present and the tokenizer linked to the model."""

    def add_arguments_to_parser(self, parser) -> None:
        from wide.callbacks import SparsityMonitor, TemperatureSchedule, WideCheckpoint

        parser.add_lightning_class_args(TemperatureSchedule, "temperature")
        parser.add_lightning_class_args(SparsityMonitor, "sparsity_monitor")
        parser.add_lightning_class_args(WideCheckpoint, "wide_checkpoint")
        parser.link_arguments("model.init_args.model", "data.tokenizer")

    def _align_logger_versions(self) -> None:
        # TensorBoard and CSV loggers pick their versions independently; make the CSV files land in
        # the same run folder as the TensorBoard events, the routers and the heatmaps
        loggers = self.trainer.loggers
        if len(loggers) > 1 and hasattr(loggers[0], "version"):
            for other in loggers[1:]:
                if hasattr(other, "_version") and getattr(other, "_experiment", None) is None:
                    other._version = loggers[0].version

    def before_fit(self) -> None:
        self._align_logger_versions()

    def before_validate(self) -> None:
        self._align_logger_versions()

    def before_test(self) -> None:
        self._align_logger_versions()


def run_cli(args: Optional[list[str]] = None, run: bool = True) -> WideCLI:
    from wide.data import TextDataModule
    from wide.tasks import WideTask

    return WideCLI(
        WideTask,
        TextDataModule,
        subclass_mode_model=True,
        parser_kwargs={"parser_mode": "omegaconf"},
        trainer_defaults=TRAINER_DEFAULTS,
        save_config_kwargs={"overwrite": True},
        seed_everything_default=17,
        args=args,
        run=run,
    )


def _resolve(target: str) -> Callable[[list[str]], Optional[int]]:
    module, _, fn = target.partition(":")
    return getattr(importlib.import_module(module), fn)


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS:
        return int(_resolve(SUBCOMMANDS[argv[0]])(argv[1:]) or 0)
    run_cli(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
