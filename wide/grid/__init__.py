"""``wide grid``: Cartesian ablation sweeps over `wide fit` recipes, evaluated with `wide eval`.

A grid file (see :mod:`wide.grid.spec`) names a base recipe and axes of overrides. Each cell runs, in
order: stage-1 ``wide fit`` (shared by all cells with the same stage-1 settings), stage-2
``wide fit`` when ``stage: lora``, then ``wide eval``; training-free cells (``fit: false``) and the
dense cell (``routing: false``) only evaluate. Output, under the grid's ``output`` folder::

    cells/<cell>/   cell.json, eval/results.{json,md}, eval.log, result.json (done marker), [lora/]
    fits/calibrate-<hash>/   routers.safetensors, done.json, fit.log, logs/version_0/ (TensorBoard, CSV, config)
    results.csv, results.md, plots/score_vs_sparsity.png, plots/sparsity_heatmap.png, plots/heatmaps/<cell>.png

Re-running the same command skips finished cells (and reuses finished fits); a cell whose settings
changed since it finished runs again.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from wide.grid.spec import Axis, Cell, GridSpec, load_grid, parse_set

__all__ = ["Axis", "Cell", "GridSpec", "grid_main", "load_grid", "run_grid"]


def run_grid(path: str, *, output: Optional[str] = None, overrides: Optional[dict] = None, launcher: str = "subprocess",
             force: bool = False, fail_fast: bool = False, only: Sequence[str] = (), verbose: bool = False,
             jobs: int = 1, devices: Sequence[str] = ()) -> dict:
    """Loads and runs a grid file; returns ``{"done", "skipped", "failed", "cells"}`` (lists of cell names)."""
    from wide.grid.runner import GridRunner

    spec = load_grid(path, output=output, extra_overrides=overrides)
    return GridRunner(spec, launcher=launcher, force=force, fail_fast=fail_fast, only=list(only),
                      verbose=verbose, jobs=jobs, devices=list(devices)).run()


def grid_main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``wide grid``; returns the exit status (1 when a cell failed)."""
    p = argparse.ArgumentParser(
        prog="wide grid",
        description="Run a Cartesian grid of `wide fit` + `wide eval` cells from a grid file (recipes/ablations/*.yaml); "
                    "resumable; writes results.csv, results.md and plots.",
        epilog="example: wide grid recipes/ablations/methods_x_sparsity.yaml --set trainer.max_steps=50 "
               "--set eval.limit=100 --output runs/grid/quick")
    p.add_argument("grid", help="grid YAML file")
    p.add_argument("--output", default=None, help="output folder (default: the file's `output`, else runs/grid/<stem>)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override for every cell (a LightningCLI dotted key, calibrate./lora. scoped key, or eval.<option>), "
                        "applied before the axes (an axis setting the same key wins); repeatable")
    p.add_argument("--launcher", default="subprocess", choices=["subprocess", "inprocess"],
                   help="run each fit/eval in a fresh process (default) or in this one")
    p.add_argument("--only", action="append", default=[], metavar="SUBSTRING", help="run only matching cells (repeatable)")
    p.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="run up to N cells at once (cells sharing a stage-1 fit stay in order in one worker)")
    p.add_argument("--devices", default="", metavar="IDS",
                   help="CUDA devices for the workers, round-robin, e.g. 0,1 (default: inherit CUDA_VISIBLE_DEVICES)")
    p.add_argument("--force", action="store_true", help="re-run finished cells and fits")
    p.add_argument("--fail-fast", action="store_true", help="stop at the first failed cell")
    p.add_argument("--dry-run", action="store_true", help="list the cells and their commands, run nothing")
    p.add_argument("--collect", action="store_true", help="only rebuild results.csv/md and plots from finished cells")
    p.add_argument("--verbose", action="store_true", help="echo the fit/eval output (always kept in the cells' .log files)")
    args = p.parse_args(argv)
    try:
        spec = load_grid(args.grid, output=args.output, extra_overrides=parse_set(args.set))
        if args.dry_run:
            _dry_run(spec)
            return 0
        if args.collect:
            from wide.grid.report import collect

            for path in collect(spec):
                print(path)
            return 0
        from wide.grid.runner import GridRunner

        devices = [d for d in args.devices.split(",") if d.strip()]
        summary = GridRunner(spec, launcher=args.launcher, force=args.force, fail_fast=args.fail_fast,
                             only=args.only, verbose=args.verbose, jobs=args.jobs, devices=devices).run()
    except ValueError as err:
        print(f"wide grid: error: {err}", file=sys.stderr)
        return 2
    from pathlib import Path

    md = Path(spec.output) / "results.md"
    if md.is_file():
        print(md.read_text())
    return 1 if summary["failed"] else 0


def _dry_run(spec: GridSpec) -> None:
    import shlex
    from pathlib import Path

    from wide.grid.commands import eval_argv, fit_argv, lora_alpha
    from wide.grid.runner import GridRunner

    runner = GridRunner(spec)
    cells = spec.cells()
    print(f"{len(cells)} cells, output {spec.output}")
    for cell in cells:
        print(f"\n{cell.name}")
        ckpt, alpha = None, None
        if cell.fits:
            if cell.calibrates:
                run_dir = runner.fit_dir(cell, runner.stage1_signature(cell))
                print("  wide " + shlex.join(fit_argv(spec, cell, "calibrate", run_dir)))
                ckpt = run_dir / "routers.safetensors"
            if cell.stage == "lora":
                lora_dir = Path(spec.output) / "cells" / cell.name / "lora"
                print("  wide " + shlex.join(fit_argv(spec, cell, "lora", lora_dir, ckpt)))
                ckpt = lora_dir / "routers.safetensors"
                alpha = lora_alpha(spec, cell)
        print("  wide " + shlex.join(eval_argv(spec, cell, Path(spec.output) / "cells" / cell.name / "eval", ckpt, alpha)))
