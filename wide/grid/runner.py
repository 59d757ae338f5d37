"""Run a grid: per cell, fit (stage 1, optionally stage 2) then eval; resumable, with progress across cells."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from wide.grid.commands import eval_argv, fit_argv, lora_alpha, model_name
from wide.grid.files import duration, read_json, write_json
from wide.grid.spec import Cell, GridSpec, routing_dict, select_cells, signature

FORMAT = "wide-grid/1"
LAUNCHERS = ("subprocess", "inprocess")


def _log(msg: str) -> None:
    print(f"wide grid: {msg}", file=sys.stderr, flush=True)


class CommandFailed(RuntimeError):
    def __init__(self, what: str, log_path: Path, detail: str):
        super().__init__(f"{what} failed (log: {log_path}): {detail}")
        self.log_path = log_path


@dataclass
class GridRunner:
    """Runs the cells of ``spec``: :meth:`run` on this machine (``jobs`` threads over ``devices``, the
    fallback without Ray); :class:`wide.grid.ray_executor.RayExecutor` runs the same cells as Ray tasks.

    Args:
        spec: The parsed grid.
        launcher: ``subprocess`` (each ``wide fit``/``wide eval`` in a fresh Python; robust to crashes and
            leaks) or ``inprocess`` (the same CLIs called in this process; faster to start, for tests).
        force: Re-run finished cells and fits.
        fail_fast: Stop at the first failed cell (default: record the failure and go on).
        only: Run only the cells one of these patterns picks (`wide.grid.spec.select_cells`).
        verbose: Echo the commands' output (it always goes to the cell's ``*.log`` files).
        jobs: Cells run at once (subprocess launcher). Cells that share a stage-1 fit, or that evaluate the
            same untrained model, stay in order in one worker, so nothing is computed twice.
        devices: CUDA device ids handed to the workers round-robin (each worker's commands see only its
            device through ``CUDA_VISIBLE_DEVICES``); empty: the commands inherit the environment.
        log: Progress sink.
    """

    spec: GridSpec
    launcher: str = "subprocess"
    force: bool = False
    fail_fast: bool = False
    only: list[str] = field(default_factory=list)
    verbose: bool = False
    jobs: int = 1
    devices: list[str] = field(default_factory=list)
    log: Callable[[str], None] = _log

    def __post_init__(self) -> None:
        if self.launcher not in LAUNCHERS:
            raise ValueError(f"launcher: must be one of {LAUNCHERS}, got {self.launcher!r}")
        if not (isinstance(self.jobs, int) and self.jobs >= 1):
            raise ValueError(f"jobs: must be an integer >= 1, got {self.jobs!r}")
        if self.jobs > 1 and self.launcher != "subprocess":
            raise ValueError("jobs: running cells at once needs the subprocess launcher (--launcher subprocess)")
        bad = [d for d in self.devices if not str(d).strip().isdigit()]
        if bad:
            raise ValueError(f"devices: expected CUDA device ids like 0,1, got {bad}")
        self.out = Path(self.spec.output)
        self._local = threading.local()  # the device of the worker thread running a command
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------------------ commands
    def _run(self, argv: list[str], log_path: Path, what: str, append: bool = False) -> float:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        if self.launcher == "inprocess":
            from wide.cli import main

            log_path.write_text("in-process run: output went to the console\n$ wide " + " ".join(argv) + "\n")
            try:
                rc = main(list(argv))
            except SystemExit as err:  # argparse / jsonargparse errors
                rc = err.code if isinstance(err.code, int) else 1
            except Exception as err:  # noqa: BLE001 - a failed cell must not stop the grid
                raise CommandFailed(what, log_path, f"{type(err).__name__}: {err}") from err
            if rc:
                raise CommandFailed(what, log_path, f"exit status {rc}")
            return time.perf_counter() - t0
        cmd = [sys.executable, "-m", "wide.cli", *argv]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        device = getattr(self._local, "device", None)
        if device is not None:
            env["CUDA_VISIBLE_DEVICES"] = device
        with log_path.open("a" if append else "w") as sink:
            sink.write("$ wide " + " ".join(argv) + "\n")
            sink.flush()
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
            assert proc.stdout is not None
            try:
                for line in proc.stdout:
                    sink.write(line)
                    sink.flush()
                    if self.verbose:
                        sys.stderr.write(line)
                rc = proc.wait()
            except BaseException:  # interrupted (Ctrl-C, a cancelled Ray task): leave no orphaned command
                proc.kill()
                proc.wait()
                raise
        if rc:
            tail = log_path.read_text().strip().splitlines()[-12:]
            raise CommandFailed(what, log_path, f"exit status {rc}\n    " + "\n    ".join(tail))
        return time.perf_counter() - t0

    # ---------------------------------------------------------------------------------------- fits
    def _fit(self, cell: Cell, stage: str, run_dir: Path, sig: str, prefix: str,
             router_checkpoint: Optional[Path] = None) -> dict[str, Any]:
        done = read_json(run_dir / "done.json")
        ckpt = run_dir / "routers.safetensors"
        if not self.force and done and done.get("signature") == sig and ckpt.is_file():
            self.log(f"{prefix} fit {stage}: reusing {run_dir}")
            return done
        argv = fit_argv(self.spec, cell, stage, run_dir, router_checkpoint)
        started = read_json(run_dir / "started.json")
        resume = run_dir / "last.ckpt"
        resuming = not self.force and started and started.get("signature") == sig and resume.is_file()
        if resuming:
            # an interrupted run of the same settings: continue from Lightning's resume checkpoint; the
            # wall time of earlier attempts counts up to their last resume checkpoint
            argv += ["--ckpt_path", str(resume)]
            prior = started.get("prior_wall_s", 0.0) + max(0.0, resume.stat().st_mtime - started["attempt_start"])
            self.log(f"{prefix} fit {stage}: resuming from {resume}")
        else:
            if run_dir.exists():
                shutil.rmtree(run_dir)
            prior = 0.0
        write_json(run_dir / "started.json", {"signature": sig, "cell": cell.name, "stage": stage,
                                              "attempt_start": time.time(), "prior_wall_s": prior})
        self.log(f"{prefix} fit {stage} → {run_dir}")
        wall = prior + self._run(argv, run_dir / "fit.log", f"fit {stage} of {cell.name}", append=bool(resuming))
        if not ckpt.is_file():
            raise CommandFailed(f"fit {stage} of {cell.name}", run_dir / "fit.log", f"{ckpt} was not written")
        info = run_stats(run_dir, ckpt)
        info.update({"resumed": bool(resuming), "signature": sig, "run_id": f"{sig}-{time.time():.0f}",
                     "stage": stage, "cell": cell.name, "overrides": cell.cli_overrides(stage), "wall_s": wall,
                     "argv": ["wide", *argv], "dir": str(run_dir), "checkpoint": str(ckpt)})
        write_json(run_dir / "done.json", info)
        self.log(f"{prefix} fit {stage} done: {info['steps']} steps, {info['tokens']:,} tokens, {duration(wall)}")
        return info

    def fit_dir(self, cell: Cell, sig: str) -> Path:
        """Stage-1 run folder: named by content, so cells with equal stage-1 settings share one run."""
        return self.out / "fits" / f"calibrate-{sig}"

    # ---------------------------------------------------------------------------------------- cells
    def stage1_signature(self, cell: Cell) -> str:
        """What a stage-1 fit depends on: cells with equal ones share the fit."""
        return signature({"base": self.spec.base_settings("calibrate"), "overrides": cell.cli_overrides("calibrate")})

    def untrained_eval_signature(self, cell: Cell) -> str:
        """The eval signature of a cell that trains nothing (the key of ``eval_cache``)."""
        argv = eval_argv(self.spec, cell, self.out / "cells" / cell.name / "eval", None, None)
        return signature({"argv": argv[:-3], "runs": []})

    def cell_signature(self, cell: Cell) -> str:
        return signature({"format": FORMAT, "overrides": cell.settings(), "eval": self.spec.eval,
                          "calibrate": self.spec.base_settings("calibrate") if cell.fits else "",
                          "lora": self.spec.base_settings("lora") if cell.fits and cell.stage == "lora" else "",
                          "routing": routing_dict(self.spec, cell) if cell.skip_calibration else None})

    def finished(self, cell: Cell, prev: Optional[dict[str, Any]] = None) -> bool:
        """Whether ``cell`` has a finished result with today's settings (a run skips it unless ``force``): its
        ``result.json`` (``prev`` when already read) says done under the same `cell_signature` (settings, eval,
        base recipes' settings)."""
        prev = read_json(self.out / "cells" / cell.name / "result.json") if prev is None else prev
        return bool(prev) and prev.get("status") == "done" and prev.get("signature") == self.cell_signature(cell)

    def run_cell(self, cell: Cell, prefix: str, eval_cache: dict[str, Path]) -> dict[str, Any]:
        cell_dir = self.out / "cells" / cell.name
        cell_dir.mkdir(parents=True, exist_ok=True)
        (cell_dir / "error.txt").unlink(missing_ok=True)
        write_json(cell_dir / "cell.json", {"name": cell.name, "labels": cell.labels, "overrides": cell.overrides,
                                            "fits": cell.fits, "stage": cell.stage})
        runs: dict[str, Any] = {}
        checkpoint, alpha = None, None
        if cell.fits:
            sig1 = None
            if cell.calibrates:
                sig1 = self.stage1_signature(cell)
                runs["calibrate"] = self._fit(cell, "calibrate", self.fit_dir(cell, sig1), sig1, prefix)
                checkpoint = Path(runs["calibrate"]["checkpoint"])
            if cell.stage == "lora":
                sig2 = signature({"base": self.spec.base_settings("lora"), "overrides": cell.cli_overrides("lora"),
                                  "stage1": sig1})
                runs["lora"] = self._fit(cell, "lora", cell_dir / "lora", sig2, prefix, router_checkpoint=checkpoint)
                checkpoint = Path(runs["lora"]["checkpoint"])
                alpha = lora_alpha(self.spec, cell)
        eval_dir = cell_dir / "eval"
        argv = eval_argv(self.spec, cell, eval_dir, checkpoint, alpha)
        # the same model (same fit runs, or no fit) under the same eval settings gives the same result
        eval_sig = signature({"argv": argv[:-3], "runs": [r.get("run_id", r.get("signature")) for r in runs.values()]})
        cached = eval_cache.get(eval_sig)
        t0 = time.perf_counter()
        if cached is not None and cached.resolve() != (eval_dir / "results.json").resolve() and cached.is_file():
            eval_dir.mkdir(parents=True, exist_ok=True)
            for name in ("results.json", "results.md"):
                if (cached.parent / name).is_file():
                    shutil.copyfile(cached.parent / name, eval_dir / name)
            self.log(f"{prefix} eval: same model and settings as {cached.parent.parent.name}; result copied")
            wall = 0.0
        else:
            self.log(f"{prefix} eval → {eval_dir}")
            wall = self._run(argv, cell_dir / "eval.log", f"eval of {cell.name}")
        results = read_json(eval_dir / "results.json")
        if results is None:
            raise CommandFailed(f"eval of {cell.name}", cell_dir / "eval.log", "results.json was not written")
        eval_cache[eval_sig] = eval_dir / "results.json"
        summary = results["summary"]
        row = {
            "format": FORMAT,
            "cell": cell.name,
            "labels": cell.labels,
            "overrides": cell.overrides,
            "status": "done",
            "signature": self.cell_signature(cell),
            "eval_signature": eval_sig,
            "model": model_name(self.spec, cell),
            "stage": cell.stage if cell.fits else "none",
            "routing": None if cell.dense else routing_dict(self.spec, cell),
            "runs": {k: {f: v.get(f) for f in ("steps", "tokens", "wall_s", "batch_size", "seq_len", "devices",
                                               "accumulate_grad_batches", "dir")} for k, v in runs.items()},
            "eval": {"wall_s": wall if cached is None else 0.0, "copied_from": str(cached) if cached else None,
                     "argv": ["wide", *argv], "results": str(eval_dir / "results.json")},
            "summary": summary,
            "tasks": {t: {"score": r["score"], "metric": r["metric"], "n": r["n"],
                          "sparsity": r["sparsity"]["sparsity"]} for t, r in results["tasks"].items()},
            "hardware": results.get("hardware"),
            "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
            "eval_elapsed_s": time.perf_counter() - t0,
        }
        write_json(cell_dir / "result.json", row)
        return row

    def chains(self, cells: list[Cell]) -> list[list[Cell]]:
        """Cells that must run in order, one after the other: those sharing a stage-1 fit (the first runs it,
        the others reuse it), and untrained cells evaluating the same model (the later ones copy the first's
        result). Every other cell is a chain of its own."""
        groups: dict[str, list[Cell]] = {}
        for cell in cells:
            if cell.calibrates:
                key = str(self.fit_dir(cell, self.stage1_signature(cell)))
            elif not cell.fits:
                key = "eval:" + self.untrained_eval_signature(cell)
            else:
                key = "cell:" + cell.name
            groups.setdefault(key, []).append(cell)
        return list(groups.values())

    # -------------------------------------------------------------------------------- one grid run
    def plan(self) -> "Plan":
        """Writes ``grid.json`` and sorts the selected cells into finished (skipped) and to run."""
        cells = select_cells(self.spec.cells(), self.only)
        self.out.mkdir(parents=True, exist_ok=True)
        write_json(self.out / "grid.json", {"format": FORMAT, "grid": str(self.spec.path), "spec": self.spec.raw,
                                            "overrides": self.spec.overrides, "eval": self.spec.eval,
                                            "cells": [c.name for c in self.spec.cells()]})
        plan = Plan(cells=cells)
        for cell in cells:
            prev = read_json(self.out / "cells" / cell.name / "result.json")
            prev_eval = self.out / "cells" / cell.name / "eval" / "results.json"
            if not self.force and prev and prev.get("eval_signature") and prev_eval.is_file():
                plan.eval_cache.setdefault(prev["eval_signature"], prev_eval)
            if not self.force and self.finished(cell, prev):
                plan.skipped.append(cell.name)
            else:
                if prev and prev.get("signature") != self.cell_signature(cell):
                    self.log(f"{cell.name}: settings changed since its last run; running it again")
                plan.todo.append(cell)
        self.log(f"{len(cells)} cells in {self.out} ({len(plan.skipped)} already finished, {len(plan.todo)} to run, "
                 f"launcher {self.launcher})")
        for name in plan.skipped:
            self.log(f"[skip] {name}: finished earlier")
        return plan

    def attempt(self, cell: Cell, prefix: str, eval_cache: dict[str, Path]) -> tuple[Optional[dict[str, Any]], Optional[str]]:
        """Runs one cell; returns ``(result row, None)`` or ``(None, error text)`` for a failed cell."""
        try:
            return self.run_cell(cell, prefix, eval_cache), None
        except (CommandFailed, ValueError) as err:
            return None, str(err)

    def record(self, plan: "Plan", cell: Cell, prefix: str, row: Optional[dict[str, Any]], error: Optional[str],
               elapsed: float) -> None:
        """Books a finished or failed cell: its ``error.txt``, progress lines and the interim tables."""
        from wide.grid.report import collect

        error_txt = self.out / "cells" / cell.name / "error.txt"
        with self._lock:
            if row is None:
                plan.failed.append(cell.name)
                error_txt.parent.mkdir(parents=True, exist_ok=True)
                error_txt.write_text(f"{error}\n")
                self.log(f"{prefix} FAILED: {error}")
                if self.fail_fast:
                    plan.stop.set()
            else:
                plan.done.append(cell.name)
                error_txt.unlink(missing_ok=True)
                self.log(f"{prefix} done in {duration(elapsed)}: {describe(row['summary'])}")
            collect(self.spec, plots=False)
            finished = len(plan.done) + len(plan.failed)
            spent = time.perf_counter() - plan.t_start
            left = len(plan.todo) - finished
            eta = f", ~{duration(spent / finished * left)} left" if left > 0 else ""  # throughput so far
            self.log(f"progress: {len(plan.skipped) + finished}/{len(plan.cells)} cells ({len(plan.done)} run, "
                     f"{len(plan.skipped)} skipped, {len(plan.failed)} failed), elapsed {duration(spent)}{eta}")

    def finish(self, plan: "Plan") -> dict[str, Any]:
        """Writes the final tables and plots; returns ``{"done", "skipped", "failed", "cells"}``."""
        from wide.grid.report import collect

        paths = collect(self.spec, plots=True)
        self.log("wrote " + ", ".join(str(p) for p in paths))
        if plan.failed:
            self.log(f"{len(plan.failed)} cell(s) failed: {', '.join(plan.failed)} (see cells/<name>/error.txt); "
                     "re-run the same command to retry them")
        return {"done": plan.done, "skipped": plan.skipped, "failed": plan.failed, "cells": [c.name for c in plan.cells]}

    # ----------------------------------------------------------- the home-made scheduler (no Ray)
    def run_one(self, plan: "Plan", cell: Cell) -> None:
        with self._lock:
            prefix = plan.next_prefix(cell)
        t0 = time.perf_counter()
        row, error = self.attempt(cell, prefix, plan.eval_cache)
        self.record(plan, cell, prefix, row, error, time.perf_counter() - t0)

    def _run_parallel(self, plan: "Plan") -> None:
        """Runs the chains on up to ``jobs`` threads; each thread's commands get one device.

        The fallback when Ray is not used (``--executor local``): one machine, whole chains per worker.
        """
        import queue
        from concurrent.futures import ThreadPoolExecutor

        groups = self.chains(plan.todo)
        slots: "queue.Queue[int]" = queue.Queue()
        for k in range(self.jobs):
            slots.put(k)
        devices = [str(d).strip() for d in self.devices]
        self.log(f"{len(plan.todo)} cells in {len(groups)} independent group(s), {self.jobs} at once"
                 + (f" on CUDA devices {','.join(devices)}" if devices else ""))

        def work(group: list[Cell]) -> None:
            slot = slots.get()
            self._local.device = devices[slot % len(devices)] if devices else None
            try:
                for cell in group:
                    if plan.stop.is_set():
                        return
                    self.run_one(plan, cell)
            finally:
                self._local.device = None
                slots.put(slot)

        with ThreadPoolExecutor(max_workers=self.jobs, thread_name_prefix="wide-grid") as pool:
            for fut in [pool.submit(work, g) for g in groups]:
                fut.result()

    def run(self) -> dict[str, Any]:
        """Runs the grid on this machine; returns ``{"done", "skipped", "failed", "cells"}`` and writes the reports."""
        plan = self.plan()
        if any(c.resources for c in plan.todo):
            self.log("resources.* settings only place Ray tasks (--executor ray); the local executor ignores them")
        if self.jobs == 1 and not self.devices:  # with devices, the one worker's commands get devices[0]
            for cell in plan.todo:
                if plan.stop.is_set():
                    break
                self.run_one(plan, cell)
        else:
            self._run_parallel(plan)
        return self.finish(plan)


@dataclass
class Plan:
    """One run of a grid: the selected cells, those to run, and the tally so far."""

    cells: list[Cell]
    todo: list[Cell] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    eval_cache: dict[str, Path] = field(default_factory=dict)
    """``{eval signature: results.json}`` of finished evals (a cell with the same one copies the result)."""
    done: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    t_start: float = field(default_factory=time.perf_counter)
    started: int = 0

    def next_prefix(self, cell: Cell) -> str:
        """``[k/total] name:``, numbered in the order cells start (finished cells count first)."""
        self.started += 1
        return f"[{len(self.skipped) + self.started}/{len(self.cells)}] {cell.name}:"


def describe(summary: dict[str, Any]) -> str:
    """``ppl 12.34 · avg 45.6 · sparsity 49.8% (target 50%)`` of an eval summary."""
    parts = []
    if summary.get("ppl") is not None:
        parts.append(f"ppl {summary['ppl']:.2f}")
    if summary.get("avg") is not None:
        parts.append(f"avg {100 * summary['avg']:.1f}")
    parts.append(f"sparsity {100 * summary['sparsity']['sparsity']:.1f}% (target {100 * summary['target_sparsity']:.0f}%)")
    return " · ".join(parts)


def run_stats(run_dir: Path, checkpoint: Path) -> dict[str, Any]:
    """Steps (from the checkpoint), batch geometry (from the run's saved config) and tokens seen.

    ``tokens = steps × batch_size × seq_len × accumulate_grad_batches × devices`` (packed rows are
    all real tokens; with ``mode: sample`` it counts padding too). ``devices: auto`` counts as 1.
    """
    import yaml

    from wide.io.checkpoint import read_metadata

    meta = read_metadata(checkpoint)
    cfg = {}
    for candidate in sorted(run_dir.glob("logs/*/config.yaml")) + [run_dir / "config.yaml"]:
        if candidate.is_file():
            cfg = yaml.safe_load(candidate.read_text()) or {}
            break
    data = cfg.get("data", {}) or {}
    data = data.get("init_args", data)
    trainer = cfg.get("trainer", {}) or {}
    bs, seq = data.get("batch_size"), data.get("seq_len")
    accum = trainer.get("accumulate_grad_batches") or 1
    devices = trainer.get("devices")
    n_dev = devices if isinstance(devices, int) else (len(devices) if isinstance(devices, list) else 1)
    steps = int(meta["step"])
    tokens = steps * bs * seq * accum * n_dev if isinstance(bs, int) and isinstance(seq, int) else None
    return {"steps": steps, "tokens": tokens, "batch_size": bs, "seq_len": seq, "accumulate_grad_batches": accum,
            "devices": devices, "precision": trainer.get("precision")}
