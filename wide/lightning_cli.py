"""LightningCLI for ``wide fit|validate|test``: the task (``model.class_path``: ``RouterCalibration`` or
``LoRARecovery``) and the text datamodule, in OmegaConf parser mode so recipes can interpolate.

Kept apart from :mod:`wide.cli` so that the other subcommands, ``--help`` and argument errors do not import
Lightning.
"""

from __future__ import annotations

import re
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
    """LightningCLI with the routing and throughput callbacks always present and the tokenizer linked to the model."""

    def add_arguments_to_parser(self, parser) -> None:
        from wide.callbacks import SparsityMonitor, TemperatureSchedule, TokenThroughput, WideCheckpoint

        parser.add_lightning_class_args(TemperatureSchedule, "temperature")
        parser.add_lightning_class_args(SparsityMonitor, "sparsity_monitor")
        parser.add_lightning_class_args(WideCheckpoint, "wide_checkpoint")
        parser.add_lightning_class_args(TokenThroughput, "throughput")
        parser.link_arguments("model.init_args.model", "data.tokenizer")

    def parse_arguments(self, parser, args) -> None:
        super().parse_arguments(parser, args)
        # LightningCLI reads the hyperparameters of a --ckpt_path file next; refuse a foreign or unsafe
        # file here with one clear error
        from wide.tasks.checks import read_resume_file

        subcommand = self.config.get("subcommand")
        if subcommand:
            read_resume_file(self.config[subcommand].get("ckpt_path"))

    def _align_logger_versions(self) -> None:
        # TensorBoard and CSV loggers pick their versions independently; make the CSV files land in
        # the same run folder as the TensorBoard events, the routers and the heatmaps
        loggers = self.trainer.loggers
        if len(loggers) > 1 and hasattr(loggers[0], "version"):
            for other in loggers[1:]:
                if hasattr(other, "_version") and getattr(other, "_experiment", None) is None:
                    other._version = loggers[0].version

    def _before(self) -> None:
        self._align_logger_versions()
        config = self.config_init[self.subcommand]
        if config.get("weights_only") is None:
            config["weights_only"] = True  # our .ckpt files hold tensors and plain values only
        from wide.callbacks import WideCheckpoint

        ckpts = [c for c in self.trainer.callbacks if isinstance(c, WideCheckpoint)]
        if config.get("ckpt_path") == "last" and ckpts and ckpts[0].dirpath is None:
            raise ValueError("ckpt_path: 'last' needs a fixed --wide_checkpoint.dirpath (the default folder "
                             "changes with every run version), e.g. the one of the run to resume")
        self.model.preflight(self.datamodule, self.trainer, config.get("ckpt_path"))  # fails before any compute

    def before_fit(self) -> None:
        self._before()

    def before_validate(self) -> None:
        self._before()

    def before_test(self) -> None:
        self._before()


def run_cli(args: Optional[list[str]] = None, run: bool = True) -> WideCLI:
    from wide.data import TextDataModule
    from wide.tasks import WideTask

    return WideCLI(
        WideTask,
        TextDataModule,
        subclass_mode_model=True,
        parser_class=WideArgumentParser,
        parser_kwargs={"parser_mode": "omegaconf"},
        trainer_defaults=TRAINER_DEFAULTS,
        save_config_kwargs={"overwrite": True},
        seed_everything_default=17,
        args=args,
        run=run,
    )
