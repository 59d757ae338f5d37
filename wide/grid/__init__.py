"""``wide grid``: Cartesian ablation sweeps over `wide fit` recipes, evaluated with `wide eval`.

A grid file (see :mod:`wide.grid.spec`) names a base recipe and axes of overrides. Each cell runs, in
order: stage-1 ``wide fit`` (shared by all cells with the same stage-1 settings), stage-2
``wide fit`` when ``stage: lora``, then ``wide eval``; training-free cells (``fit: false``) and the
dense cell (``routing: false``) only evaluate. Output, under the grid's ``output`` folder::

    cells/<cell>/   cell.json, eval/results.{json,md}, eval.log, result.json (done marker), [lora/]
    fits/calibrate-<hash>/   routers.safetensors, done.json, fit.log, logs/version_0/ (TensorBoard, CSV, config)
    results.csv, results.md, plots/score_vs_sparsity.png, plots/sparsity_heatmap.png, plots/heatmaps/<cell>.png

Re-running the same command skips finished cells (and reuses finished fits); a cell whose settings
changed since it finished runs again. Cells run on this machine (``--jobs N --devices 0,1``), or as Ray
tasks with ``--executor ray`` (a local Ray instance) or ``--ray-address`` (a cluster): see
:mod:`wide.grid.ray_executor`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from wide.grid.spec import Axis, Cell, GridSpec, load_grid, parse_set

__all__ = ["EXECUTORS", "Axis", "Cell", "GridSpec", "grid_main", "load_grid", "run_grid"]


EXECUTORS = ("local", "ray")


def run_grid(path: str, *, output: Optional[str] = None, overrides: Optional[dict] = None, launcher: str = "subprocess",
             force: bool = False, fail_fast: bool = False, only: Sequence[str] = (), verbose: bool = False,
             jobs: int = 1, devices: Sequence[str] = (), executor: Optional[str] = None,
             ray_address: Optional[str] = None, gpus_per_cell: Optional[float] = None,
             cpus_per_cell: Optional[float] = None) -> dict:
    """Loads and runs a grid file; returns ``{"done", "skipped", "failed", "cells"}`` (lists of cell names).

    ``executor``: ``local`` (this machine, ``jobs``/``devices``) or ``ray`` (each cell a Ray task asking for
    ``gpus_per_cell``/``cpus_per_cell``, on a local Ray instance or the cluster at ``ray_address``);
    default ``ray`` when ``ray_address`` is given, else ``local``.
    """
    spec = load_grid(path, output=output, extra_overrides=overrides)
    return _executor(spec, launcher=launcher, force=force, fail_fast=fail_fast, only=list(only), verbose=verbose,
                     jobs=jobs, devices=list(devices), executor=executor, ray_address=ray_address,
                     gpus_per_cell=gpus_per_cell, cpus_per_cell=cpus_per_cell).run()


def _executor(spec: GridSpec, *, executor: Optional[str], ray_address: Optional[str],
              gpus_per_cell: Optional[float], cpus_per_cell: Optional[float], **runner_args):
    """The runner (local) or Ray executor of a grid, its settings checked before anything runs."""
    from wide.grid.runner import GridRunner

    if executor is None:
        executor = "ray" if ray_address else "local"
    if executor not in EXECUTORS:
        raise ValueError(f"--executor: must be one of {EXECUTORS}, got {executor!r}")
    from wide.outputs import check_output_dir

    check_output_dir(spec.output, "--output", results=())  # resumable: finished cells in it are kept
    runner = GridRunner(spec, **runner_args)
    if executor == "local":
        given = [flag for flag, value in (("--ray-address", ray_address), ("--gpus-per-cell", gpus_per_cell),
                                          ("--cpus-per-cell", cpus_per_cell)) if value is not None]
        if given:
            raise ValueError(f"{', '.join(given)}: only with --executor ray (the local executor uses --jobs/--devices)")
        return runner
    from wide.grid.ray_executor import RayExecutor

    return RayExecutor(runner, address=ray_address, gpus_per_cell=gpus_per_cell,
                       cpus_per_cell=1.0 if cpus_per_cell is None else cpus_per_cell)


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
                   help="override for every cell (a LightningCLI dotted key, calibrate./lora. scoped key, eval.<option> "
                        "or resources.gpus/cpus), applied before the axes (an axis setting the same key wins); repeatable")
    p.add_argument("--launcher", default="subprocess", choices=["subprocess", "inprocess"],
                   help="run each fit/eval in a fresh process (default) or in this one")
    p.add_argument("--only", action="append", default=[], metavar="PATTERN",
                   help="run only matching cells (repeatable): part of a cell name; a trailing axis=value matches the "
                        "whole value (ffn_group=896 is not ffn_group=8960)")
    p.add_argument("--executor", default=None, choices=EXECUTORS,
                   help="local: this machine's worker threads (--jobs, --devices; the default); ray: each cell a Ray "
                        "task on a local Ray instance, or on the cluster of --ray-address or RAY_ADDRESS "
                        '(pip install "wide[ray]")')
    p.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="Ray cluster to run the cells on (e.g. ray://head:10001, auto); implies --executor ray")
    p.add_argument("--gpus-per-cell", type=float, default=None, metavar="N",
                   help="Ray: GPUs each cell's task asks for unless the cell sets resources.gpus (default: 1 when the "
                        "cluster has GPUs, else 0; fractions share a GPU)")
    p.add_argument("--cpus-per-cell", type=float, default=None, metavar="N",
                   help="Ray: CPUs each cell's task asks for unless the cell sets resources.cpus (default 1)")
    p.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="local: run up to N cells at once (cells sharing a stage-1 fit stay in order in one worker)")
    p.add_argument("--devices", default="", metavar="IDS",
                   help="local: CUDA devices for the workers, round-robin, e.g. 0,1 (default: inherit CUDA_VISIBLE_DEVICES)")
    p.add_argument("--force", action="store_true", help="re-run finished cells and fits")
    p.add_argument("--fail-fast", action="store_true", help="stop at the first failed cell")
    p.add_argument("--dry-run", action="store_true", help="list the cells and their commands (and which are finished), run nothing")
    p.add_argument("--collect", action="store_true", help="only rebuild results.csv/md and plots from finished cells")
    p.add_argument("--verbose", action="store_true", help="echo the fit/eval output (always kept in the cells' .log files)")
    args = p.parse_args(argv)
    try:
        spec = load_grid(args.grid, output=args.output, extra_overrides=parse_set(args.set))
        if args.dry_run:
            _dry_run(spec, args.only)
            return 0
        if args.collect:
            from wide.grid.report import collect

            for path in collect(spec):
                print(path)
            return 0
        devices = [d for d in args.devices.split(",") if d.strip()]
        executor = _executor(spec, launcher=args.launcher, force=args.force, fail_fast=args.fail_fast,
                             only=args.only, verbose=args.verbose, jobs=args.jobs, devices=devices,
                             executor=args.executor, ray_address=args.ray_address,
                             gpus_per_cell=args.gpus_per_cell, cpus_per_cell=args.cpus_per_cell)
        summary = executor.run()
    except ValueError as err:
        print(f"wide grid: error: {err}", file=sys.stderr)
        return 2
    from pathlib import Path

    md = Path(spec.output) / "results.md"
    if md.is_file():
        print(md.read_text())
    return 1 if summary["failed"] else 0


def _dry_run(spec: GridSpec, only: Sequence[str] = ()) -> None:
    import shlex
    from pathlib import Path

    from wide.grid.commands import eval_argv, fit_argv, lora_alpha
    from wide.grid.runner import GridRunner
    from wide.grid.spec import select_cells

    runner = GridRunner(spec)
    cells = select_cells(spec.cells(), list(only))  # as the run filters them
    done = {c.name for c in cells if runner.finished(c)}
    print(f"{len(cells)} cells, output {spec.output}" + (f" ({len(done)} finished: a run skips them)" if done else ""))
    for cell in cells:
        print(f"\n{cell.name}" + (" (finished)" if cell.name in done else ""))
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
