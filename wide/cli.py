"""The ``wide`` command.

``wide fit|validate|test`` run LightningCLI (:mod:`wide.lightning_cli`) over a task and the text datamodule.
Other subcommands are plain argparse programs. This module imports neither torch nor Lightning: ``wide --help``,
``wide assets list`` and argument errors answer at once, and each subcommand imports only what it runs.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Callable, Optional

# name -> "module:function" taking argv; imported lazily so `wide fit` does not pay for them
SUBCOMMANDS: dict[str, str] = {
    "assets": "wide.assets.cli:assets_main",
    "bench": "wide.bench.cli:bench_main",
    "data": "wide.data.cli:data_main",
    "eval": "wide.eval.cli:eval_main",
    "export": "wide.deploy:export_main",
    "generate": "wide.deploy:generate_main",
    "grid": "wide.grid:grid_main",
}
LIGHTNING_SUBCOMMANDS = ("fit", "validate", "test")

# one line each for `wide --help`, in the order a user meets them
SUMMARIES: dict[str, str] = {
    "fit": "train: router calibration (stage 1) or LoRA recovery (stage 2) from a recipe (--config FILE)",
    "validate": "one validation pass of a task over the held-out split",
    "test": "one test pass of a task",
    "eval": "perplexity and zero-shot accuracy of a dense, training-free routed or trained model",
    "export": "write a routed model folder (weights + routers) that `wide.load` and `generate` read",
    "generate": "generate text with a dense, routed or exported model",
    "grid": "Cartesian sweeps of fit + eval cells from a grid file, resumable, with tables and plots",
    "bench": "end-to-end prefill latency and decode throughput, dense vs routed",
    "assets": "list, fetch or locate the offline models and data (no hub needed)",
    "data": "build training data: `wide data generate` writes self-distillation jsonl shards",
}

# the LightningCLI names, importable from here as before (`from wide.cli import run_cli`)
_LAZY = ("TRAINER_DEFAULTS", "WideArgumentParser", "WideCLI", "run_cli")


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module("wide.lightning_cli"), name)
    raise AttributeError(f"module 'wide.cli' has no attribute {name!r}")


def usage() -> str:
    """The text of ``wide --help``: every subcommand with one line."""
    width = max(map(len, SUMMARIES))
    lines = ["usage: wide <command> [options]   (wide <command> --help for its options)", "", "commands:"]
    lines += [f"  {name.ljust(width)}  {text}" for name, text in SUMMARIES.items()]
    lines += ["", "examples:", "  wide fit --config recipes/smollm2-135m/calibrate.yaml",
              "  wide eval --limit 20", "  wide assets list", "",
              "WIDE_TRACEBACK=1 shows the full traceback of an error."]
    return "\n".join(lines)


def _resolve(target: str) -> Callable[[list[str]], Optional[int]]:
    module, _, fn = target.partition(":")
    return getattr(importlib.import_module(module), fn)


def main(argv: Optional[list[str]] = None) -> int:
    """Runs ``wide <subcommand>``. Bad input and numerical blow-ups print one ``wide <cmd>: error: ...`` line
    and return 1; ``WIDE_TRACEBACK=1`` re-raises them with the full traceback."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] == "--version":
        from wide import __version__

        print(f"wide {__version__}")
        return 0
    if argv[0] in SUBCOMMANDS:
        return int(_resolve(SUBCOMMANDS[argv[0]])(argv[1:]) or 0)
    if not argv[0].startswith("-") and argv[0] not in LIGHTNING_SUBCOMMANDS:
        from wide.registry import suggest

        print(f"wide: error: unknown command {argv[0]!r}.{suggest(argv[0], SUMMARIES)} Commands: "
              f"{', '.join(SUMMARIES)}", file=sys.stderr)
        return 2
    from wide.assets.errors import AssetError
    from wide.lightning_cli import run_cli
    from wide.trainer import quiet_lightning

    quiet_lightning()  # after the import: Lightning's own warning filters would come first

    try:
        run_cli(argv)
    except (ValueError, FloatingPointError, AssetError) as err:
        if os.environ.get("WIDE_TRACEBACK"):
            raise
        print(f"wide {argv[0] if argv else ''}: error: {_summary(err)}", file=sys.stderr)
        return 1
    return 0


def _summary(err: BaseException) -> str:
    """The message of ``err``; for jsonargparse's nested union errors, only the validators' own lines."""
    noise = ("Does not validate against", "Subtypes:", "Errors:", "Expected a <class", "Given value")
    lines = [line.strip().removeprefix("- ") for line in str(err).splitlines()]
    core = [line for line in lines if line and not line.startswith(noise)]
    return "; ".join(dict.fromkeys(core)) or str(err)


if __name__ == "__main__":
    sys.exit(main())
