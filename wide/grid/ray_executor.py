"""Run a grid's cells as Ray tasks: on a local Ray instance by default, on a cluster with ``--ray-address``.

Each cell is one Ray task that asks for its GPUs and CPUs (the cell's ``resources.gpus`` /
``resources.cpus``, else ``--gpus-per-cell`` / ``--cpus-per-cell``); Ray starts it where they are free and
shows it only its GPUs (``CUDA_VISIBLE_DEVICES``). Cells that must run in order
(:meth:`~wide.grid.runner.GridRunner.chains`: a shared stage-1 fit, or the same untrained model) form a
chain: each task takes the previous one's outcome as an argument, so Ray starts it only once that one
has finished. Nothing else is scheduled here.

A task returns the files its cell wrote (results, logs, the routers of its fits; not Lightning's
resume ``.ckpt``). The driver writes those its output folder lacks and builds the tables and plots, so
the results end up on the driver's machine even when the workers do not share its filesystem; the next
task of a chain writes them on its own node, so a shared stage-1 fit is found wherever the chain goes on.
The workers need the grid's recipes, data and model at the same paths as the driver (a shared
filesystem, or the same checkout and cache on every node).
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from wide.grid.files import write_bytes
from wide.grid.runner import GridRunner, Plan
from wide.grid.spec import Cell

RAY_INSTALL = 'pip install "wide[ray]"'


def import_ray() -> Any:
    """The ``ray`` module, or one ``ValueError`` that says how to install it."""
    try:
        import ray
    except ImportError as err:
        raise ValueError(f"the Ray executor (--executor ray / --ray-address) needs Ray, which is not installed: "
                         f"{RAY_INSTALL}") from err
    return ray


@dataclass
class RayExecutor:
    """Runs a :class:`GridRunner`'s cells as Ray tasks (see the module docstring).

    Args:
        runner: The grid and how its commands run (launcher, force, fail_fast, only, verbose).
        address: A Ray cluster (``ray://head:10001``, ``head:6379`` or ``auto``); ``None``: the cluster
            named by ``RAY_ADDRESS``, else a new Ray instance on this machine, shut down at the end.
        gpus_per_cell: GPUs a cell's task asks for unless the cell sets ``resources.gpus``; ``None``: 1 when
            the Ray cluster has GPUs, else 0. Fractions share a GPU.
        cpus_per_cell: CPUs a cell's task asks for unless the cell sets ``resources.cpus`` (Ray also sets the
            task's ``OMP_NUM_THREADS`` to it).
    """

    runner: GridRunner
    address: Optional[str] = None
    gpus_per_cell: Optional[float] = None
    cpus_per_cell: float = 1.0

    def __post_init__(self) -> None:
        for flag, value in (("--gpus-per-cell", self.gpus_per_cell), ("--cpus-per-cell", self.cpus_per_cell)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
                raise ValueError(f"{flag}: must be a number >= 0, got {value!r}")
        if self.runner.jobs != 1 or self.runner.devices:
            raise ValueError("--jobs/--devices: the Ray executor runs as many cells at once as their resources allow "
                             "(--gpus-per-cell, --cpus-per-cell); to give a local Ray instance only some GPUs, set "
                             "CUDA_VISIBLE_DEVICES")
        self.ray = import_ray()

    def run(self) -> dict[str, Any]:
        """Runs the grid; returns ``{"done", "skipped", "failed", "cells"}`` and writes the reports."""
        ray = self.ray
        plan = self.runner.plan()
        if plan.todo:  # a grid that is all done starts no Ray
            started_here = not ray.is_initialized()
            if started_here:
                self._init()
            try:
                self._run(plan)
            finally:
                if started_here:
                    ray.shutdown()
        return self.runner.finish(plan)

    def _init(self) -> None:
        # cells see the driver's WIDE_* settings (cache, kernel backend), as the local executor's commands do
        env = {k: v for k, v in os.environ.items() if k.startswith("WIDE_")}
        try:
            self.ray.init(address=self.address, runtime_env={"env_vars": env} if env else None)
        except (ConnectionError, RuntimeError) as err:
            where = f"--ray-address {self.address}: cannot connect to the Ray cluster" if self.address else \
                "--executor ray: cannot start or join Ray"
            raise ValueError(f"{where}: {err}") from err

    def resources(self, cell: Cell) -> dict[str, float]:
        """``{"gpus", "cpus"}`` of a cell's task."""
        gpus = self.gpus_per_cell
        if gpus is None:
            gpus = 1 if self.ray.cluster_resources().get("GPU", 0) >= 1 else 0
        return {"gpus": gpus, "cpus": self.cpus_per_cell, **cell.resources}

    def _run(self, plan: Plan) -> None:
        ray, runner = self.ray, self.runner
        total = ray.cluster_resources()
        asks = {cell.name: self.resources(cell) for cell in plan.todo}
        for name, ask in asks.items():
            short = [f"{ask[k]:g} {key}(s) (the cluster has {total.get(key, 0):g})"
                     for k, key in (("gpus", "GPU"), ("cpus", "CPU")) if ask[k] > total.get(key, 0)]
            if short:  # Ray would wait forever for such a task (a cluster's autoscaler may still add nodes)
                msg = f"cell {name} asks for " + " and ".join(short)
                if not self.address and "RAY_ADDRESS" not in os.environ:
                    raise ValueError(f"{msg}; lower resources.* / --gpus-per-cell / --cpus-per-cell")
                runner.log(f"warning: {msg}; it waits until the cluster grows")
        job = ray.put({"spec": dataclasses.replace(runner.spec, output=Path(runner.spec.output).resolve()),
                       "launcher": runner.launcher, "force": runner.force, "verbose": runner.verbose,
                       "cwd": os.getcwd()})
        # GPU tasks get a fresh worker process each (Ray's own default for GPU functions, which .options()
        # cannot set): CUDA state and the device mapping never carry over from one cell to the next
        cpu_task, gpu_task = ray.remote(_cell_task), ray.remote(max_calls=1)(_cell_task)
        tasks: dict[Any, tuple[Cell, str, Any]] = {}
        chains = runner.chains(plan.todo)
        for chain in chains:
            before = None
            for i, cell in enumerate(chain):
                ask = asks[cell.name]
                fn = gpu_task if ask["gpus"] > 0 else cpu_task
                prefix = plan.next_prefix(cell)
                seed = self._seed(plan, cell, head=i == 0)
                ref = fn.options(num_gpus=ask["gpus"], num_cpus=ask["cpus"], max_retries=0,
                                 name=f"wide-grid {cell.name}").remote(job, cell, prefix, seed, before)
                tasks[ref] = (cell, prefix, before)
                before = ref
        runner.log(f"Ray: {len(plan.todo)} cells as tasks in {len(chains)} chain(s) on "
                   f"{total.get('CPU', 0):g} CPU(s), {total.get('GPU', 0):g} GPU(s)")
        pending = list(tasks)
        try:
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                cell, prefix, before = tasks[ready[0]]
                try:
                    outcome = ray.get(ready[0])
                except ray.exceptions.RayError as err:
                    outcome = {"row": None, "error": self._failure(err, before, tasks), "elapsed": 0.0, "files": {}}
                unpack(runner.out, outcome["files"])
                runner.record(plan, cell, prefix, outcome["row"], outcome["error"], outcome["elapsed"])
                if plan.stop.is_set():  # --fail-fast
                    break
        finally:
            for ref in pending:  # a failure under --fail-fast, Ctrl-C: nothing keeps running for this grid
                ray.cancel(ref)

    def _failure(self, err: Exception, before: Any, tasks: dict[Any, tuple[Cell, str, Any]]) -> str:
        """The error of a task that raised (not a Ray traceback dump)."""
        if before is not None:
            try:
                self.ray.get(before)
            except self.ray.exceptions.RayError:
                return f"not run: {tasks[before][0].name}, before it in its chain, failed"
        return task_error(err)

    def _seed(self, plan: Plan, cell: Cell, head: bool) -> dict[str, Any]:
        """Files of finished work on the driver that the cell's task can reuse on any node."""
        runner, files, cache = self.runner, {}, {}
        if runner.force:
            return {"files": files, "eval_cache": cache}
        lora = runner.out / "cells" / cell.name / "lora"
        if (lora / "done.json").is_file():
            files.update(pack(runner.out, lora))
        if head and cell.calibrates:
            fit = runner.fit_dir(cell, runner.stage1_signature(cell))
            if (fit / "done.json").is_file():
                files.update(pack(runner.out, fit))
        elif head and not cell.fits:
            sig = runner.untrained_eval_signature(cell)
            hit = plan.eval_cache.get(sig)
            if hit is not None and hit.is_file():
                files.update(pack(runner.out, hit.parent))
                cache[sig] = hit.relative_to(runner.out).as_posix()
        return {"files": files, "eval_cache": cache}


def task_error(err: BaseException) -> str:
    """``Type: message`` of the exception a Ray task raised (Ray's own message for a lost or killed task)."""
    cause = getattr(err, "cause", None)  # RayTaskError: the task's own exception
    if cause is not None:
        return f"{type(cause).__name__}: {cause}"
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0] if lines else ''}"


def pack(out: Path, folder: Path) -> dict[str, bytes]:
    """The files under ``folder`` keyed by their path relative to ``out`` (no resume ``.ckpt``, no temp files)."""
    files = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.suffix != ".ckpt" and not path.name.startswith("."):
            files[path.relative_to(out).as_posix()] = path.read_bytes()
    return files


def unpack(out: Path, files: dict[str, bytes]) -> None:
    """Writes the files that ``out`` lacks or holds with other contents."""
    for rel, data in files.items():
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise ValueError(f"grid: refusing to write {rel!r} outside {out}")
        path = out / rel
        if not (path.is_file() and path.read_bytes() == data):
            write_bytes(path, data)


def _cell_task(job: dict[str, Any], cell: Cell, prefix: str, seed: dict[str, Any],
               before: Optional[dict[str, Any]]) -> dict[str, Any]:
    """One cell on a Ray worker: writes what the driver and the chain before it left, runs the cell and
    returns its outcome: ``{"row", "error", "elapsed", "files", "eval_cache"}``.

    A failed command or bad setting is an outcome (``error``); anything else raises, and the driver
    lists the cell with that exception.
    """
    if os.path.isdir(job["cwd"]):
        os.chdir(job["cwd"])  # relative paths in the overrides (data.source: docs.txt) mean the driver's cwd
    runner = GridRunner(job["spec"], launcher=job["launcher"], force=job["force"], verbose=job["verbose"])
    eval_cache = {}
    for given in (seed, before or {}):
        unpack(runner.out, given.get("files", {}))
        eval_cache.update({sig: runner.out / rel for sig, rel in given.get("eval_cache", {}).items()})
    t0 = time.perf_counter()
    row, error = runner.attempt(cell, prefix, eval_cache)
    elapsed = time.perf_counter() - t0
    files = pack(runner.out, runner.out / "cells" / cell.name)
    if cell.calibrates:
        fit = runner.fit_dir(cell, runner.stage1_signature(cell))
        if fit.is_dir():
            files.update(pack(runner.out, fit))
    cache = {}
    if row is not None:
        cache[row["eval_signature"]] = Path(row["eval"]["results"]).relative_to(runner.out).as_posix()
    return {"row": row, "error": error, "elapsed": elapsed, "files": files, "eval_cache": cache}
