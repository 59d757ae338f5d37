"""LightningCLI for ``wide fit|validate|test``: the task (``model.class_path``: ``RouterCalibration`` or
``LoRARecovery``) and the text datamodule, in OmegaConf parser mode so recipes can interpolate.

Kept apart from :mod:`wide.cli` so that the other subcommands, ``--help`` and argument errors do not import
Lightning.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Optional

from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

TRAINER_DEFAULTS = {
    "logger": [
        {"class_path": "lightning.pytorch.loggers.TensorBoardLogger", "init_args": {"save_dir": "runs", "name": "wide"}},
        {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": "runs", "name": "wide"}},
    ],
    "log_every_n_steps": 5,
}


class WideArgumentParser(LightningArgumentParser):
    """LightningCLI's parser, naming a plug-in ``class_path`` that cannot be imported in one line."""

    _CLASS_PATH = re.compile(r"class_path'?:?=?\s*'([A-Za-z_][\w.]*)'")
    _KEY = re.compile(r'Parser key "([^"]+)"')
    _REPORTED = re.compile(r"^[\s-]*([\w.]+: class_path '[^']*' cannot be imported .*)$", re.M)

    def error(self, message: str, ex: Optional[Exception] = None):
        # jsonargparse reports a bad class_path or key as a nested union error under the whole usage: raise one
        # ValueError naming it, which `main` prints as one line. The parsers of nested classes report first
        # (exit_on_error off) and the outer ones wrap their message: keep the innermost line
        from wide.cli_errors import unknown_key
        from wide.registry import import_class_path

        reported = self._REPORTED.search(message)
        if reported:
            raise ValueError(reported.group(1)) from None
        for m in self._CLASS_PATH.finditer(message):
            keys = self._KEY.findall(message, 0, m.start())
            import_class_path(m.group(1), field=keys[-1] if keys else "class_path")  # raises for the bad one
        if self.exit_on_error:  # the final report, not a nested parser's try
            line = unknown_key(self, message)
            if line:
                raise ValueError(f"{line} (`wide {self._subcommand_name(message)}--help` lists them)") from None
        super().error(message, ex)

    def _subcommand_name(self, message: str) -> str:
        named = re.search(r"Subcommand '(\w+)'", message)
        name = named.group(1) if named else (self.prog.split()[-1] if self.prog else "")
        return f"{name} " if name in ("fit", "validate", "test") else ""


class WideCLI(LightningCLI):
    """LightningCLI with the routing (the end-of-fit rate calibration among them), throughput and progress callbacks
    always present, the tokenizer linked to the model, ``precision: auto``, and runs that neither overwrite nor leave
    behind anything by accident."""

    def add_arguments_to_parser(self, parser) -> None:
        from wide.callbacks import (RateCalibration, SparsityMonitor, TemperatureSchedule, TokenThroughput,
                                    WideCheckpoint)

        parser.add_lightning_class_args(TemperatureSchedule, "temperature")
        parser.add_lightning_class_args(SparsityMonitor, "sparsity_monitor")
        parser.add_lightning_class_args(RateCalibration, "rate_calibration")
        parser.add_lightning_class_args(WideCheckpoint, "wide_checkpoint")
        parser.add_lightning_class_args(TokenThroughput, "throughput")
        parser.link_arguments("model.init_args.model", "data.tokenizer")
        parser.add_argument("--overwrite", action="store_true",
                            help="Let fit replace an earlier run's results in --wide_checkpoint.dirpath")
        parser.link_arguments("overwrite", "wide_checkpoint.overwrite")

    def parse_arguments(self, parser, args) -> None:
        from wide.trainer import quiet_lightning

        quiet_lightning()
        super().parse_arguments(parser, args)
        # LightningCLI reads the hyperparameters of a --ckpt_path file next; refuse a foreign or unsafe
        # file here with one clear error
        from wide.tasks.checks import read_resume_file

        subcommand = self.config.get("subcommand")
        if subcommand:
            read_resume_file(self.config[subcommand].get("ckpt_path"))

    def _parse_ckpt_path(self) -> None:
        # LightningCLI replaces the given model arguments by a --ckpt_path file's, silently dropping overrides
        # (`--ckpt_path last.ckpt --model.init_args.routing.ffn_group_size 32` trained on with the checkpoint's
        # 64); keep what was given: the preflight names every setting that differs from the checkpoint's
        return

    def _instantiate_trainer(self, config: dict, callbacks: list):
        from lightning.pytorch.callbacks import ProgressBar

        from wide.callbacks import StepProgress

        given = config.get("callbacks") or []
        given = given if isinstance(given, list) else [given]
        if config.get("enable_progress_bar", True) is not False and not any(
                isinstance(c, ProgressBar) for c in [*given, *callbacks]):
            callbacks = [*callbacks, StepProgress()]  # steps of the whole run, plain lines into log files
        return super()._instantiate_trainer(config, callbacks)

    def _align_logger_versions(self) -> None:
        # TensorBoard and CSV loggers pick their versions independently; make the CSV files land in
        # the same run folder as the TensorBoard events, the routers and the heatmaps
        loggers = self.trainer.loggers
        if len(loggers) > 1 and hasattr(loggers[0], "version"):
            for other in loggers[1:]:
                if hasattr(other, "_version") and getattr(other, "_experiment", None) is None:
                    other._version = loggers[0].version

    def _run_dirs(self) -> list[Path]:
        dirs = {Path(d) for d in (getattr(lg, "log_dir", None) for lg in self.trainer.loggers) if d}
        return sorted(dirs)

    def _run_subcommand(self, subcommand: str) -> None:
        self._align_logger_versions()
        fresh = [d for d in self._run_dirs() if not d.exists()]
        try:
            super()._run_subcommand(subcommand)
        except BaseException:
            # a run that failed or was stopped before its first step leaves no empty version folder behind
            if self.trainer.is_global_zero and getattr(self.model, "steps_this_run", 0) == 0:
                for folder in fresh:
                    shutil.rmtree(folder, ignore_errors=True)
            raise

    def _wide_checkpoint(self):
        from wide.callbacks import WideCheckpoint

        return next((c for c in self.trainer.callbacks if isinstance(c, WideCheckpoint)), None)

    def _before(self) -> None:
        config = self.config_init[self.subcommand]
        if config.get("weights_only") is None:
            config["weights_only"] = True  # our .ckpt files hold tensors and plain values only
        ckpt = self._wide_checkpoint()
        ckpt_path = config.get("ckpt_path")
        if ckpt_path == "last" and ckpt is not None and ckpt.dirpath is None:
            raise ValueError("ckpt_path: 'last' needs a fixed --wide_checkpoint.dirpath (the default folder "
                             "changes with every run version), e.g. the one of the run to resume")
        if self.subcommand == "fit" and ckpt is not None:
            ckpt.check_fresh(ckpt_path)  # refuses to overwrite an earlier run's results
        if ckpt_path == "last" and ckpt is not None and (Path(ckpt.dirpath) / "last.ckpt").is_file():
            ckpt_path = str(Path(ckpt.dirpath) / "last.ckpt")  # what Lightning will resume from
        self.model.preflight(self.datamodule, self.trainer, ckpt_path)  # fails before any compute

    def before_fit(self) -> None:
        self._before()

    def before_validate(self) -> None:
        self._before()

    def before_test(self) -> None:
        self._before()


def run_cli(args: Optional[list[str]] = None, run: bool = True) -> WideCLI:
    from wide.data import TextDataModule
    from wide.tasks import WideTask
    from wide.trainer import WideTrainer

    return WideCLI(
        WideTask,
        TextDataModule,
        trainer_class=WideTrainer,
        subclass_mode_model=True,
        parser_class=WideArgumentParser,
        parser_kwargs={"parser_mode": "omegaconf"},
        trainer_defaults=TRAINER_DEFAULTS,
        save_config_kwargs={"overwrite": True},
        seed_everything_default=17,
        args=args,
        run=run,
    )
