"""`wide grid`: grid files, cells, commands, a tiny 2x2 run with tables and plots, resume, LoRA cells, shipped grids."""

import csv
import json
from pathlib import Path

import pytest
import yaml

from tests.grid.grids import METHOD_X_SPARSITY, ROOT, SMOL, set_eval, write_grid
from wide.grid import grid_main, load_grid, run_grid
from wide.grid.commands import eval_argv, fit_argv
from wide.grid.spec import config_value, effective_config

pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")

ABLATIONS = sorted((ROOT / "recipes" / "ablations").glob("*.yaml"))


# ------------------------------------------------------------------------------------------ spec


def test_cells_are_the_cartesian_product_in_order(tmp_path, tiny_model_dir, tiny_corpus):
    spec = load_grid(write_grid(tmp_path / "g.yaml", tiny_model_dir, tiny_corpus, METHOD_X_SPARSITY))
    cells = spec.cells()
    assert [c.name for c in cells] == ["method=topk__target=0.25", "method=topk__target=0.5",
                                       "method=wide__target=0.25", "method=wide__target=0.5"]
    topk, wide_ = cells[1], cells[3]
    assert not topk.fits and wide_.fits and wide_.overrides["model.init_args.routing.sparsity"] == 0.5
    argv = fit_argv(spec, wide_, "calibrate", tmp_path / "run")
    assert argv[:3] == ["fit", "--config", str(SMOL / "calibrate.yaml")]
    assert argv[argv.index("--model.init_args.routing.sparsity") + 1] == "0.5"
    assert argv[argv.index("--wide_checkpoint.dirpath") + 1] == str(tmp_path / "run")
    ev = eval_argv(spec, topk, tmp_path / "ev")
    routing = json.loads(ev[ev.index("--routing") + 1])
    assert routing["router"] == "topk" and routing["sparsity"] == 0.5 and routing["ffn_group_size"] == 32
    assert ev[ev.index("--limit") + 1] == "2" and ev[ev.index("--output") + 1] == str(tmp_path / "ev")


def test_stage_scoping(tmp_path, tiny_model_dir, tiny_corpus):
    axes = [{"name": "stage", "key": "stage", "values": ["calibrate", "lora"]}]
    spec = load_grid(write_grid(tmp_path / "g.yaml", tiny_model_dir, tiny_corpus, axes, lora=True,
                                ) , extra_overrides={"calibrate.model.init_args.lr": 0.01, "eval.limit": 1})
    lora = spec.cells()[1]
    assert lora.stage == "lora" and spec.eval["limit"] == 1
    stage1, stage2 = lora.cli_overrides("calibrate"), lora.cli_overrides("lora")
    assert stage1["model.init_args.lr"] == 0.01 and "model.init_args.lr" not in stage2
    assert "model.init_args.routing.ffn_group_size" in stage1 and not any("routing" in k for k in stage2)
    assert stage2["model.init_args.lora_r"] == 4 and stage2["trainer.max_steps"] == 2


@pytest.mark.parametrize("mutate,message", [
    (lambda g: g.pop("base"), "'base'"),
    (lambda g: g.update(bogus=1), "unknown key"),
    (lambda g: g["axes"].append({"name": "x"}), "'name' and 'values'"),
    (lambda g: g["axes"].append({"name": "x", "key": "k", "values": 3}), "non-empty list"),
    (lambda g: g["axes"].append({"name": "ppl", "key": "k", "values": [1]}), "clash"),
    (lambda g: g["axes"].append({"name": "s", "key": "stage", "values": ["lora"]}), "lora_base"),
    (lambda g: g["axes"].append({"name": "s", "key": "stage", "values": ["distill"]}), "stage must be"),
    (lambda g: g["eval"].update(bogus=1), "unknown eval option"),
    (lambda g: g["axes"][0]["values"]["topk"].update({"model.init_args.routing.granularity": "nope"}), "granularity"),
    (lambda g: g["overrides"].update({"resources.gpu": 1}), "unknown key resources.gpu"),
    (lambda g: g["axes"][0]["values"]["wide"].update({"resources.cpus": -1}), "resources.cpus must be a number >= 0"),
], ids=["no-base", "unknown-key", "bad-axis", "bad-values", "clash", "lora-needs-base", "bad-stage", "bad-eval",
        "bad-routing", "bad-resource", "negative-resource"])
def test_bad_grids_fail_before_running(tmp_path, tiny_model_dir, tiny_corpus, mutate, message):
    path = write_grid(tmp_path / "g.yaml", tiny_model_dir, tiny_corpus, json.loads(json.dumps(METHOD_X_SPARSITY)))
    grid = yaml.safe_load(path.read_text())
    mutate(grid)
    path.write_text(yaml.safe_dump(grid))
    with pytest.raises(ValueError, match=message):
        load_grid(path)


# ------------------------------------------------------------------------------------------ runs


def test_tiny_2x2_grid_tables_plots_and_resume(tmp_path, tiny_model_dir, tiny_corpus, capsys):
    path = write_grid(tmp_path / "g.yaml", tiny_model_dir, tiny_corpus, METHOD_X_SPARSITY)
    first = run_grid(str(path), launcher="inprocess")
    out = tmp_path / "out"
    assert len(first["done"]) == 4 and not first["failed"] and not first["skipped"]
    rows = (out / "results.csv").read_text().strip().splitlines()
    header = rows[0].split(",")
    assert len(rows) == 5 and {"method", "target", "ppl", "avg", "realized_sparsity", "hellaswag",
                               "calibrate_tokens", "calibrate_wall_s"} <= set(header)
    md = (out / "results.md").read_text()
    assert "| topk | 0.5 | width/topk | none | 50.0 | 50.0 |" in md and "### Runs" in md
    for png in ["score_vs_sparsity.png", "sparsity_heatmap.png", "heatmaps/method=wide__target=0.5.png",
                "heatmaps/method=topk__target=0.25.png"]:
        assert (out / "plots" / png).stat().st_size > 1000, png
    result = json.loads((out / "cells/method=wide__target=0.5/result.json").read_text())
    assert result["runs"]["calibrate"]["steps"] == 2 and result["runs"]["calibrate"]["tokens"] == 2 * 2 * 32
    assert set(result["tasks"]) == {"arc_easy", "arc_challenge", "boolq", "winogrande", "piqa", "openbookqa",
                                    "hellaswag"}
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("cells/*/result.json")}

    capsys.readouterr()
    assert grid_main([str(path), "--launcher", "inprocess"]) == 0  # the re-run skips every finished cell
    io = capsys.readouterr()
    assert io.err.count("[skip]") == 4 and "fit calibrate" not in io.err and "| method | target |" in io.out
    assert stamps == {p: p.stat().st_mtime_ns for p in out.glob("cells/*/result.json")}
    assert grid_main([str(path), "--dry-run"]) == 0  # the listing says which cells a run would skip
    listing = capsys.readouterr().out
    assert "4 cells, output" in listing and "(4 finished: a run skips them)" in listing
    assert listing.count(" (finished)\n") == 4

    # a changed eval setting re-evaluates every cell but reuses the finished fits
    again = run_grid(str(path), launcher="inprocess", overrides={"eval.limit": 1}, only=["wide__target=0.5"])
    assert again["done"] == ["method=wide__target=0.5"]
    assert "reusing" in capsys.readouterr().err

    # an interrupted fit (resume checkpoint written, no done marker) continues from Lightning's last.ckpt
    fit_dir = Path(result["runs"]["calibrate"]["dir"])
    if not (fit_dir / "last.ckpt").is_file():
        pytest.skip("WideCheckpoint wrote no last.ckpt: nothing to resume from")
    (fit_dir / "done.json").unlink()
    (out / "cells/method=wide__target=0.5/result.json").unlink()
    resumed = run_grid(str(path), launcher="inprocess", overrides={"eval.limit": 1}, only=["wide__target=0.5"])
    assert resumed["done"] == ["method=wide__target=0.5"] and "resuming from" in capsys.readouterr().err
    assert json.loads((fit_dir / "done.json").read_text())["resumed"]


def test_lora_cells_share_stage1_and_skip_calibration(tmp_path, tiny_model_dir, tiny_corpus):
    axes = [{"name": "method", "values": {
                "dense": {"routing": False},
                "topk": {"skip_calibration": True, "model.init_args.routing.router": "topk"},
                "wide": {}}},
            {"name": "stage", "key": "stage", "values": ["calibrate", "lora"]}]
    path = write_grid(tmp_path / "g.yaml", tiny_model_dir, tiny_corpus, axes, lora=True)
    grid = yaml.safe_load(path.read_text())
    grid["eval"] = {"tasks": "piqa", "limit": 2, "ppl_window": 32, "ppl_max_tokens": 64, "device": "cpu"}
    path.write_text(yaml.safe_dump(grid))
    res = run_grid(str(path), launcher="inprocess")
    assert len(res["done"]) == 6 and not res["failed"]
    out = tmp_path / "out"
    cells = {p.parent.name: json.loads(p.read_text()) for p in out.glob("cells/*/result.json")}
    assert len(list(out.glob("fits/calibrate-*"))) == 1  # wide/calibrate and wide/lora share stage 1
    assert set(cells["method=wide__stage=lora"]["runs"]) == {"calibrate", "lora"}
    assert set(cells["method=topk__stage=lora"]["runs"]) == {"lora"}  # LoRA alone under top-k routing
    assert cells["method=topk__stage=calibrate"]["runs"] == {}
    assert cells["method=dense__stage=lora"]["eval"]["copied_from"]  # same model and settings: not re-run
    ev = json.loads((out / "cells/method=wide__stage=lora/eval/results.json").read_text())
    assert ev["model"]["checkpoint"]["lora"]["r"] == 4 and ev["model"]["checkpoint"]["lora"]["alpha"] == 32
    assert "calibrate+lora" in (out / "results.md").read_text()


def test_cells_can_add_generative_metrics_and_the_tables_show_them(tmp_path, tiny_model_dir, tiny_corpus):
    axes = [{"name": "method", "values": {
                "dense": {"routing": False},
                "topk": {"skip_calibration": True, "model.init_args.routing.router": "topk",
                         "eval.generative": "arithmetic"}}}]
    path = write_grid(tmp_path / "g.yaml", tiny_model_dir, tiny_corpus, axes)
    set_eval(path, tasks="piqa", limit=3, gen_limit=2, ppl_window=32, ppl_max_tokens=64, device="cpu")
    res = run_grid(str(path), launcher="inprocess")
    assert len(res["done"]) == 2 and not res["failed"]
    out = tmp_path / "out"
    ev = json.loads((out / "cells/method=topk/eval/results.json").read_text())
    assert ev["generative"]["arithmetic"]["n"] == 2 and ev["tasks"]["piqa"]["n"] == 3
    assert "generative" not in json.loads((out / "cells/method=dense/eval/results.json").read_text())
    rows = list(csv.DictReader((out / "results.csv").read_text().splitlines()))
    assert [r["arithmetic_em"] != "" for r in rows] == [False, True] and "token_agreement" not in rows[0]
    md = (out / "results.md").read_text()
    assert "| avg | % of dense | arith EM |" in md and "arith EM: 5-shot basic-arithmetic exact match" in md


def test_subprocess_launcher_and_failures_are_recorded(tmp_path, tiny_model_dir, tiny_corpus):
    axes = [{"name": "method", "values": {"dense": {"routing": False},
                                          "broken": {"model.init_args.routing.ffn_group_size": 48}}}]
    path = write_grid(tmp_path / "g.yaml", tiny_model_dir, tiny_corpus, axes)
    grid = yaml.safe_load(path.read_text())
    grid["eval"] = {"tasks": "none", "ppl_window": 32, "ppl_max_tokens": 64, "device": "cpu"}
    path.write_text(yaml.safe_dump(grid))
    assert grid_main([str(path)]) == 1  # one cell failed: non-zero exit, the other finished
    out = tmp_path / "out"
    assert json.loads((out / "cells/method=dense/result.json").read_text())["status"] == "done"
    error = (out / "cells/method=broken/error.txt").read_text()
    assert "fit calibrate of method=broken failed" in error and "ffn_group_size" in error
    report = (out / "results.md").read_text()
    assert "*failed*" in report
    assert "### Failed cells" in report and "ffn_group_size" in report.split("### Failed cells")[1]


# ------------------------------------------------------------------------------------ shipped grids


def test_ablation_grids_exist():
    names = {p.name for p in ABLATIONS}
    assert {"methods_x_sparsity.yaml", "quality_smollm2-135m.yaml", "quality_qwen2.5-1.5b.yaml", "quality_cpu.yaml",
            "adapters_smollm2-135m.yaml", "frontier_smollm2-135m.yaml", "frontier_qwen2.5-1.5b.yaml",
            "ffn_groups_smollm2-135m.yaml", "ffn_groups_qwen2.5-1.5b.yaml", "attn_groups_smollm2-135m.yaml"} <= names


# (layers, hidden, query heads, KV heads, head_dim, FFN width) of the offline assets the shipped grids route
ASSET_SHAPES = {"smollm2-135m": (30, 576, 9, 3, 64, 1536), "qwen2.5-1.5b": (28, 1536, 12, 2, 128, 8960)}


@pytest.mark.parametrize("grid", ABLATIONS, ids=[p.name for p in ABLATIONS])
def test_shipped_grid_routing_fits_its_model(grid, tmp_path):
    """Every routed cell's groups divide its model's heads and FFN width (what `apply_wide` checks once the model
    is loaded, minutes into a GPU run): e.g. an FFN group width that does not divide Qwen2.5-1.5B's 8960 channels."""
    from wide.config import WideConfig
    from wide.grid.commands import model_name
    from wide.grid.spec import routing_dict
    from wide.policies import POLICIES
    from wide.policies.base import LayerShape

    spec = load_grid(grid, output=tmp_path / "out")
    for cell in spec.cells():
        if cell.dense:
            continue
        cfg = WideConfig.from_dict(routing_dict(spec, cell))
        layers, hidden, heads, kv, head_dim, ffn = ASSET_SHAPES[model_name(spec, cell)]
        shape = LayerShape(0, layers, hidden, heads, kv, head_dim, ffn)
        POLICIES.get(cfg.granularity)().validate(shape, cfg)


@pytest.mark.parametrize("grid", ABLATIONS, ids=[p.name for p in ABLATIONS])
def test_shipped_grid_parses_and_every_fit_parses_in_lightning_cli(grid, tmp_path, tiny_model_dir):
    """Every cell's `wide fit` command line parses against its task (nothing is trained)."""
    from safetensors.torch import save_file

    from wide.cli import run_cli

    text = grid.read_text()
    assert text.startswith("#") and "Command:" in text, "grid files open with a comment: purpose, hardware, command"
    spec = load_grid(grid, output=tmp_path / "out")
    # a stand-in stage-1 checkpoint so that LoRARecovery can read its metadata
    import wide

    ckpt = tmp_path / "routers.safetensors"
    save_file({}, str(ckpt), metadata={"format": "wide-trained/1", "wide_config": json.dumps(wide.WideConfig().to_dict()),
                                       "base_model": "{}", "stage": "calibrate", "step": "0", "extra": "{}"})
    seen = set()
    for cell in spec.cells():
        stages = (["calibrate"] if cell.calibrates else []) + (["lora"] if cell.fits and cell.stage == "lora" else [])
        for stage in stages:
            argv = fit_argv(spec, cell, stage, tmp_path / "run", ckpt if stage == "lora" and cell.calibrates else None)
            key = tuple(argv)
            if key in seen:
                continue
            seen.add(key)
            cli = run_cli([*argv[1:], "--trainer.accelerator", "cpu", "--trainer.logger", "false"], run=False)
            routing = cli.model.routing
            loss = config_value(effective_config(spec, cell, stage), "model.init_args.loss") or {}
            assert cli.model.loss.kd == loss.get("kd", 0.0)  # a cell's loss keys merge into the recipe's block
            if stage == "calibrate":
                for k, v in cell.cli_overrides("calibrate").items():
                    if k.startswith("model.init_args.routing."):
                        assert getattr(routing, k.rsplit(".", 1)[-1]) == v
        eval_argv(spec, cell, tmp_path / "ev")
    assert seen or all(not c.fits for c in spec.cells())


# every fitted stage's (loss.kd, data.source) per method label ("*": any other cell): grids with recorded numbers pin
# the loss and data they were measured with, so a change of the base recipe's (calibrate.yaml's 2026-12-02 switch to
# self-distillation on the mixture) does not silently change what they measure; a new grid must decide here too
GRID_LOSS = {
    "adapters_smollm2-135m.yaml": {"*": (0.0, "default")},
    "attn_groups_smollm2-135m.yaml": {"*": (0.0, "mixture")},
    "ffn_groups_qwen2.5-1.5b.yaml": {"*": (0.0, "mixture")},
    "ffn_groups_smollm2-135m.yaml": {"*": (0.0, "mixture")},
    "frontier_qwen2.5-1.5b.yaml": {"*": (0.0, "mixture"), "wide_distill": (1.0, "mixture")},
    "frontier_smollm2-135m.yaml": {"*": (0.0, "mixture"), "wide_distill": (1.0, "mixture")},
    "long_smollm2-135m.yaml": {"*": (1.0, "mixture"), "wide_lm": (0.0, "default")},
    "targets_qwen2.5-1.5b.yaml": {"*": (1.0, "mixture"),
                                  "jointarith5": (1.0, "mixture:boolq,lambada,coqa,squad,drop,arithmetic=0.1"),
                                  "jointarith1": (1.0, "mixture:boolq,lambada,coqa,squad,drop,arithmetic=0.02")},
    "methods_x_sparsity.yaml": {"*": (1.0, "mixture")},
    "quality_cpu.yaml": {"*": (0.0, "default")},
    "quality_qwen2.5-1.5b.yaml": {"*": (0.0, "default")},
    "quality_smollm2-135m.yaml": {"*": (0.0, "default")},
    "rep_lie_smollm2-135m.yaml": {"*": (0.0, "default")},
    "routers.yaml": {"*": (1.0, "mixture")},
    "router_init_qwen2.5-1.5b.yaml": {"*": (1.0, "mixture")},
}


@pytest.mark.parametrize("grid", ABLATIONS, ids=[p.name for p in ABLATIONS])
def test_shipped_grid_trains_on_the_loss_and_data_it_says(grid, tmp_path):
    assert grid.name in GRID_LOSS, f"{grid.name}: say which loss and data its cells train on (GRID_LOSS)"
    spec = load_grid(grid, output=tmp_path / "out")
    for cell in spec.cells():
        stages = (["calibrate"] if cell.calibrates else []) + (["lora"] if cell.fits and cell.stage == "lora" else [])
        want = GRID_LOSS[grid.name]
        for stage in stages:
            cfg = effective_config(spec, cell, stage)
            got = (config_value(cfg, "model.init_args.loss.kd", 0.0), config_value(cfg, "data.source"))
            assert got == want.get(cell.labels.get("method", "*"), want["*"]), (cell.name, stage)


def test_parallel_workers_keep_shared_fits_in_order_and_give_each_a_device(tmp_path, tiny_model_dir, tiny_corpus,
                                                                           monkeypatch):
    """--jobs 2: cells sharing a stage-1 fit run in one worker (one fit), identical untrained evals are
    copied, every worker's commands see one device; the table equals a sequential run's."""
    from wide.grid.runner import GridRunner

    axes = [{"name": "method", "values": {"dense": {"routing": False}, "wide": {}}},
            {"name": "stage", "key": "stage", "values": ["calibrate", "lora"]}]
    path = write_grid(tmp_path / "g.yaml", tiny_model_dir, tiny_corpus, axes, lora=True)
    grid = yaml.safe_load(path.read_text())
    grid["eval"] = {"tasks": "piqa", "limit": 2, "ppl_window": 32, "ppl_max_tokens": 64, "device": "cpu"}
    path.write_text(yaml.safe_dump(grid))
    seen = []
    real = GridRunner._run

    def spy(self, argv, log_path, what, append=False):
        seen.append((what, getattr(self._local, "device", None)))
        return real(self, argv, log_path, what, append)

    monkeypatch.setattr(GridRunner, "_run", spy)
    assert grid_main([str(path), "--jobs", "2", "--devices", "7,8"]) == 0
    out = tmp_path / "out"
    assert len(list(out.glob("fits/calibrate-*"))) == 1
    whats = [w for w, _ in seen]
    assert whats.count("fit calibrate of method=wide__stage=calibrate") == 1
    assert not any(w.startswith("fit calibrate of method=wide__stage=lora") for w in whats)  # reused, not re-run
    assert whats.index("fit calibrate of method=wide__stage=calibrate") < whats.index("fit lora of method=wide__stage=lora")
    assert {d for _, d in seen} <= {"7", "8"} and all(d is not None for _, d in seen)
    cells = {p.parent.name: json.loads(p.read_text()) for p in out.glob("cells/*/result.json")}
    assert len(cells) == 4 and all(c["status"] == "done" for c in cells.values())
    assert cells["method=dense__stage=lora"]["eval"]["copied_from"]
    with pytest.raises(ValueError, match="^jobs: running cells at once needs the subprocess launcher"):
        run_grid(str(path), launcher="inprocess", jobs=2)
    assert grid_main([str(path), "--devices", "x"]) == 2


def test_one_worker_on_a_named_device_runs_its_commands_there(tmp_path, tiny_model_dir, tiny_corpus, monkeypatch):
    """--jobs 1 --devices 1 must not ignore the device (it used to run on the default GPU)."""
    from wide.grid.runner import GridRunner

    axes = [{"name": "method", "values": {"dense": {"routing": False}, "wide": {}}}]
    path = write_grid(tmp_path / "g.yaml", tiny_model_dir, tiny_corpus, axes)
    seen = []

    def fake_parallel(self, plan):
        seen.append((self.jobs, list(self.devices), len(plan.todo)))

    monkeypatch.setattr(GridRunner, "_run_parallel", fake_parallel)
    grid_main([str(path), "--devices", "1"])
    assert seen == [(1, ["1"], 2)]


def test_only_patterns_match_whole_values(tmp_path):
    """``--only ffn_group=896`` ran ffn_group=8960 too on the H200 (2026-12-04): a trailing axis=value now matches
    the whole value, a leading one the whole part; other patterns stay substrings."""
    from wide.grid.runner import GridRunner
    from wide.grid.spec import select_cells

    abl = ROOT / "recipes" / "ablations"
    groups = load_grid(abl / "ffn_groups_qwen2.5-1.5b.yaml", output=tmp_path / "g")
    names = lambda spec, *only: [c.name for c in select_cells(spec.cells(), list(only))]  # noqa: E731
    assert names(groups, "ffn_group=896") == ["ffn_group=896"]
    assert names(groups, "ffn_group=64", "ffn_group=128") == ["ffn_group=64", "ffn_group=128"]
    assert names(groups, "group=896") == []  # an axis=value part is a whole part of the name
    assert names(groups, "896") == ["ffn_group=896", "ffn_group=8960"]  # no axis=value: a plain substring
    assert len(names(groups)) == len(groups.cells())
    frontier = load_grid(abl / "frontier_qwen2.5-1.5b.yaml", output=tmp_path / "f")
    assert names(frontier, "method=wide") == [f"method=wide__target={t}" for t in ("0.25", "0.4", "0.5", "0.6")]
    assert len(names(frontier, "wide")) == 8 and len(names(frontier, "method=wide__")) == 4
    assert names(frontier, "wide__target=0.5") == ["method=wide__target=0.5"]  # a substring ending in a whole value
    assert len(names(frontier, "target=0.5")) == len(names(frontier, "__target=0.5")) == 6
    assert names(frontier, "method=depth__target=0.4") == ["method=depth__target=0.4"]
    assert names(frontier, "target=0.") == []  # a value is matched whole
    plan = GridRunner(groups, only=["ffn_group=896"]).plan()  # the run and --dry-run filter the same way
    assert [c.name for c in plan.cells] == ["ffn_group=896"]


def test_a_base_recipes_comments_and_output_paths_are_not_part_of_the_signatures(tmp_path, tiny_model_dir,
                                                                                   tiny_corpus):
    """Renaming a recipe's output folder or rewording its comments must not re-run a grid's finished cells (the
    grid sets every fit's outputs itself); changing a setting must."""
    from wide.grid.runner import GridRunner

    base = tmp_path / "base.yaml"
    text = (SMOL / "calibrate.yaml").read_text()
    base.write_text(text)
    path = write_grid(tmp_path / "g.yaml", tiny_model_dir, tiny_corpus, METHOD_X_SPARSITY)
    grid = yaml.safe_load(path.read_text())
    grid["base"] = str(base)
    path.write_text(yaml.safe_dump(grid, sort_keys=False))

    def sigs():
        runner = GridRunner(load_grid(path))
        cell = next(c for c in runner.spec.cells() if c.fits)
        return runner.stage1_signature(cell), runner.cell_signature(cell)

    before = sigs()
    edited = "# a reworded header\n" + text.replace("dirpath: runs/smollm2-135m/calibrate", "dirpath: runs/elsewhere")
    edited = edited.replace("name: smollm2-135m-calibrate", "name: another-name")
    assert edited != text and "runs/elsewhere" in edited
    base.write_text(edited)
    assert sigs() == before
    assert "lam: 20.0" in edited
    base.write_text(edited.replace("lam: 20.0", "lam: 7.0"))
    after = sigs()
    assert after[0] != before[0] and after[1] != before[1]
