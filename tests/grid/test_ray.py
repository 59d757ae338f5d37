"""`wide grid --executor ray`: cells as Ray tasks on a local Ray instance (CPU), checked against the local executor."""

import csv
import dataclasses
import json
import sys
import time

import pytest

from tests.grid.grids import set_eval, write_grid
from wide.grid import grid_main, load_grid, run_grid

pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")

TWO_CELLS = [{"name": "method", "values": {"topk": {"fit": False, "model.init_args.routing.router": "topk"},
                                           "wide": {"model.init_args.routing.router": "lowrank"}}}]
EVAL = {"tasks": "piqa", "limit": 2, "ppl_window": 32, "ppl_max_tokens": 64, "device": "cpu"}


def csv_rows(out):
    """results.csv without the timing columns."""
    with (out / "results.csv").open() as f:
        return [{k: v for k, v in row.items() if not k.endswith("_wall_s")} for row in csv.DictReader(f)]


def ray_processes(wait_s=15.0):
    """Ray's processes (GCS, raylet, workers) still running under this one, after up to ``wait_s`` to exit."""
    import psutil

    deadline = time.monotonic() + wait_s
    while True:
        left = []
        for proc in psutil.Process().children(recursive=True):
            try:
                if proc.status() != psutil.STATUS_ZOMBIE and "ray" in " ".join(proc.cmdline()):
                    left.append(proc.pid)
            except psutil.NoSuchProcess:
                pass
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def grid_file(tmp_path, name, model_dir, corpus, axes=TWO_CELLS, **kw):
    folder = tmp_path / name
    folder.mkdir()
    return set_eval(write_grid(folder / "g.yaml", model_dir, corpus, axes, **kw), **EVAL)


# ------------------------------------------------------------------------------------- without Ray


@pytest.mark.parametrize("flags", [["--executor", "ray"], ["--ray-address", "auto"]], ids=["executor", "address"])
def test_without_ray_one_error_names_the_extra(tmp_path, tiny_model_dir, tiny_corpus, monkeypatch, capsys, flags):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    path = grid_file(tmp_path, "g", tiny_model_dir, tiny_corpus)
    assert grid_main([str(path), *flags]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        'wide grid: error: the Ray executor (--executor ray / --ray-address) needs Ray, which is not installed: '
        'pip install "wide[ray]"']
    assert not (tmp_path / "g" / "out").exists()  # nothing ran


@pytest.mark.parametrize("flags,message", [
    (["--gpus-per-cell", "1"], "--gpus-per-cell: only with --executor ray"),
    (["--executor", "local", "--ray-address", "auto"], "--ray-address: only with --executor ray"),
    (["--executor", "ray", "--jobs", "2"], "--jobs/--devices: the Ray executor runs as many cells"),
    (["--executor", "ray", "--devices", "0"], "--jobs/--devices: the Ray executor runs as many cells"),
    (["--executor", "ray", "--cpus-per-cell", "-1"], "--cpus-per-cell: must be a number >= 0"),
], ids=["gpus-local", "address-local", "jobs-ray", "devices-ray", "negative-cpus"])
def test_executor_flags_are_checked_before_anything_runs(tmp_path, tiny_model_dir, tiny_corpus, capsys, flags, message):
    path = grid_file(tmp_path, "g", tiny_model_dir, tiny_corpus)
    assert grid_main([str(path), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"wide grid: error: {message}")
    assert not (tmp_path / "g" / "out").exists()


def test_a_chain_carries_its_files_to_another_node_and_to_the_driver(tmp_path, tiny_model_dir, tiny_corpus,
                                                                     monkeypatch):
    """Without a shared filesystem: the second task of a chain, on a node that never ran the first, gets the
    first's result from its outcome (and copies it, same model); the driver gets both cells' files."""
    from wide.grid.ray_executor import _cell_task, unpack
    from wide.grid.report import collect

    monkeypatch.chdir(tmp_path)  # a task changes into the driver's cwd
    same = {"fit": False, "model.init_args.routing.router": "topk"}
    path = grid_file(tmp_path, "g", tiny_model_dir, tiny_corpus, axes=[{"name": "rep", "values": {"a": same, "b": same}}])
    spec = load_grid(path)

    def node(name):
        return {"spec": dataclasses.replace(spec, output=tmp_path / name), "launcher": "inprocess", "force": False,
                "verbose": False, "cwd": str(tmp_path)}

    a, b = spec.cells()
    first = _cell_task(node("node-a"), a, "[1/2] rep=a:", {}, None)
    second = _cell_task(node("node-b"), b, "[2/2] rep=b:", {}, first)
    assert first["error"] is None and second["error"] is None
    assert second["row"]["eval"]["copied_from"] == str(tmp_path / "node-b/cells/rep=a/eval/results.json")
    for outcome in (first, second):
        unpack(spec.output, outcome["files"])
        assert not any(rel.endswith(".ckpt") for rel in outcome["files"])
    collect(spec, plots=False)
    rows = csv_rows(spec.output)
    assert [r["status"] for r in rows] == ["done", "done"] and rows[0]["ppl"] == rows[1]["ppl"] != ""


# ------------------------------------------------------------------------------- a local Ray instance


def test_ray_grid_equals_the_local_grid_resumes_and_leaves_no_ray_running(tmp_path, tiny_model_dir, tiny_corpus,
                                                                          capsys):
    """The executor starts its own local Ray instance (as `wide grid --executor ray` does) and stops it."""
    ray = pytest.importorskip("ray")
    assert not ray.is_initialized()
    local = grid_file(tmp_path, "local", tiny_model_dir, tiny_corpus)
    assert sorted(run_grid(str(local), launcher="inprocess")["done"]) == ["method=topk", "method=wide"]

    on_ray = grid_file(tmp_path, "ray", tiny_model_dir, tiny_corpus)
    assert grid_main([str(on_ray), "--executor", "ray", "--launcher", "inprocess", "--cpus-per-cell", "1"]) == 0
    assert "Ray: 2 cells as tasks in 2 chain(s)" in capsys.readouterr().err
    assert not ray.is_initialized() and not ray_processes()
    out = tmp_path / "ray" / "out"
    assert csv_rows(out) == csv_rows(tmp_path / "local" / "out")  # the same numbers, collected on the driver
    for png in ["score_vs_sparsity.png", "sparsity_heatmap.png", "heatmaps/method=wide.png"]:
        assert (out / "plots" / png).stat().st_size > 1000, png
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("cells/*/result.json")}
    assert len(stamps) == 2

    # the re-run finds both cells finished and starts no Ray at all
    assert grid_main([str(on_ray), "--executor", "ray", "--launcher", "inprocess"]) == 0
    err = capsys.readouterr().err
    assert err.count("[skip]") == 2 and "Ray:" not in err
    assert stamps == {p: p.stat().st_mtime_ns for p in out.glob("cells/*/result.json")}


@pytest.fixture(scope="module")
def local_ray(grid_olmo_cache):
    """One small Ray instance for the tests below (2 CPUs, no dashboard), shut down after them."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100 * 2**20,
             runtime_env={"env_vars": {"WIDE_CACHE": str(grid_olmo_cache)}})
    yield ray
    ray.shutdown()
    assert not ray_processes(), "Ray processes left running"


def test_ray_chains_keep_a_shared_stage1_fit_in_order_and_list_failed_cells(local_ray, tmp_path, tiny_model_dir,
                                                                             tiny_corpus):
    """wide and wide-lora share one stage-1 fit: one chain, so the fit runs once, before the LoRA cell's
    task starts (with 2 CPUs and no chain, the two would start together and both fit)."""
    axes = [{"name": "method", "values": {"wide": {}, "wide-lora": {"stage": "lora"},
                                          "broken": {"model.init_args.routing.ffn_group_size": 48}}}]
    path = grid_file(tmp_path, "g", tiny_model_dir, tiny_corpus, axes=axes, lora=True)
    res = run_grid(str(path), launcher="inprocess", executor="ray")
    assert sorted(res["done"]) == ["method=wide", "method=wide-lora"] and res["failed"] == ["method=broken"]
    assert local_ray.is_initialized()  # the executor leaves a Ray it did not start alone
    out = tmp_path / "g" / "out"
    cells = out / "cells"
    fits = [d for d in out.glob("fits/calibrate-*") if (d / "done.json").is_file()]
    assert len(fits) == 1 and json.loads((fits[0] / "done.json").read_text())["cell"] == "method=wide"
    lora = json.loads((cells / "method=wide-lora/result.json").read_text())
    assert set(lora["runs"]) == {"calibrate", "lora"} and lora["runs"]["calibrate"]["dir"] == str(fits[0].resolve())
    # in order: the LoRA cell's task began (cell.json) after the calibration cell's task ended (result.json)
    began = (cells / "method=wide-lora/cell.json").stat().st_mtime_ns
    assert began >= (cells / "method=wide/result.json").stat().st_mtime_ns
    error = (cells / "method=broken/error.txt").read_text()
    assert error.startswith("fit calibrate of method=broken failed") and "Traceback" not in error, error
    report = (out / "results.md").read_text()
    assert report.count("*failed*") == 1 and "method=broken (`cells/" in report.split("### Failed cells")[1]


def test_ray_refuses_a_cell_asking_for_more_than_the_instance_has(local_ray, tmp_path, tiny_model_dir, tiny_corpus,
                                                                 capsys):
    path = grid_file(tmp_path, "g", tiny_model_dir, tiny_corpus)
    assert grid_main([str(path), "--executor", "ray", "--set", "resources.gpus=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("wide grid: error: cell method=topk asks for 1 GPU(s) (the cluster has 0)")
    assert not list((tmp_path / "g" / "out").glob("cells/*"))


def test_a_task_that_raises_is_listed_by_its_exception_and_its_chain_as_not_run(local_ray, tmp_path, tiny_model_dir,
                                                                               tiny_corpus):
    from wide.grid.ray_executor import RayExecutor, task_error
    from wide.grid.runner import GridRunner

    @local_ray.remote
    def boom():
        raise RuntimeError("cell exploded\nsecond line")

    @local_ray.remote
    def after(before):
        return before

    first = boom.remote()
    second = after.remote(first)
    with pytest.raises(local_ray.exceptions.RayTaskError) as raised:
        local_ray.get(second)
    assert task_error(raised.value) == "RuntimeError: cell exploded\nsecond line"
    spec = load_grid(grid_file(tmp_path, "g", tiny_model_dir, tiny_corpus))
    executor = RayExecutor(GridRunner(spec))
    cell_a, cell_b = spec.cells()
    tasks = {first: (cell_a, "", None), second: (cell_b, "", first)}
    assert executor._failure(raised.value, first, tasks) == "not run: method=topk, before it in its chain, failed"
    assert executor._failure(raised.value, None, tasks) == "RuntimeError: cell exploded\nsecond line"


def test_a_cells_resources_come_from_the_cell_then_the_flags_then_the_cluster(tmp_path, tiny_model_dir, tiny_corpus,
                                                                              monkeypatch):
    """Default: one GPU per cell when the cluster has GPUs, none without; a cell's resources.* win over flags."""
    from wide.grid import ray_executor
    from wide.grid.runner import GridRunner

    class FakeRay:  # only what resources() reads: the cluster's totals
        def __init__(self, gpus):
            self.gpus = gpus

        def cluster_resources(self):
            return {"CPU": 16.0, "GPU": self.gpus}

    path = grid_file(tmp_path, "g", tiny_model_dir, tiny_corpus)
    plain = load_grid(path)
    four_cpus = load_grid(path, extra_overrides={"resources.cpus": 4})
    cell, cell4 = plain.cells()[0], four_cpus.cells()[0]
    monkeypatch.setattr(ray_executor, "import_ray", lambda: FakeRay(gpus=8.0))
    assert ray_executor.RayExecutor(GridRunner(plain)).resources(cell) == {"gpus": 1, "cpus": 1.0}
    assert ray_executor.RayExecutor(GridRunner(four_cpus)).resources(cell4) == {"gpus": 1, "cpus": 4}
    assert ray_executor.RayExecutor(GridRunner(plain), gpus_per_cell=0.5).resources(cell) == {"gpus": 0.5, "cpus": 1.0}
    monkeypatch.setattr(ray_executor, "import_ray", lambda: FakeRay(gpus=0.0))
    assert ray_executor.RayExecutor(GridRunner(plain)).resources(cell) == {"gpus": 0, "cpus": 1.0}
    assert ray_executor.RayExecutor(GridRunner(plain), cpus_per_cell=2).resources(cell) == {"gpus": 0, "cpus": 2}
