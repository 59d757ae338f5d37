"""``wide fit`` keeps earlier results and leaves nothing behind by accident: refusal to overwrite, ``--overwrite``,
resumes that name changed settings, no empty run folder after a failed run, no Lightning adverts."""

import torch

from tests.reliability.conftest import fit_args, run_wide
from wide.io.checkpoint import read_metadata

SHORT = ["--trainer.max_steps", "2", "--trainer.limit_val_batches", "0"]


def csv_logger(path) -> list[str]:
    return ["--trainer.logger", f'{{"class_path": "lightning.pytorch.loggers.CSVLogger", '
                                f'"init_args": {{"save_dir": "{path}", "name": "run"}}}}']


def test_a_fit_refuses_to_overwrite_results_unless_told(tmp_path, tiny_model_dir, tiny_corpus, capsys):
    argv = fit_args(tmp_path, tiny_model_dir, tiny_corpus, *SHORT, *csv_logger(tmp_path))
    assert run_wide([*argv, "--wide_checkpoint.every_n_steps", "1"], capsys)[0] == 0
    routers = tmp_path / "wide/routers.safetensors"
    before = routers.stat().st_mtime_ns
    rc, err = run_wide(argv, capsys)
    assert rc == 1
    lines = [line for line in err.splitlines() if "error" in line]  # the rest: Lightning's INFO lines
    assert lines == [f"wide fit: error: wide_checkpoint.dirpath: {tmp_path / 'wide'} already holds an earlier run's "
                     "results (last.ckpt, routers.safetensors, step-000001.safetensors, ...); pass --overwrite to "
                     "replace them, --ckpt_path last to resume that run, or another --wide_checkpoint.dirpath"]
    assert routers.stat().st_mtime_ns == before
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["version_0"], "the refused run left no folder"

    assert run_wide([*argv, "--trainer.max_steps", "3", "--overwrite"], capsys)[0] == 0
    assert read_metadata(routers)["step"] == 3
    assert sorted(p.name for p in routers.parent.iterdir()) == ["last.ckpt", "routers.safetensors"], \
        "the earlier run's numbered copies are gone"
    # resuming from the folder's own checkpoint is no overwrite
    assert run_wide([*argv, "--trainer.max_steps", "4", "--ckpt_path", "last"], capsys)[0] == 0
    assert read_metadata(routers)["step"] == 4


def test_a_resume_names_every_setting_that_differs(tmp_path, tiny_model_dir, tiny_corpus, capsys):
    argv = fit_args(tmp_path, tiny_model_dir, tiny_corpus, *SHORT)
    assert run_wide(argv, capsys)[0] == 0
    ckpt = str(tmp_path / "wide/last.ckpt")
    # LightningCLI alone would train on with the checkpoint's group size; the override is named instead
    changed = [*argv, "--trainer.max_steps", "4", "--ckpt_path", ckpt, "--model.init_args.routing.ffn_group_size",
               "64", "--model.init_args.lam", "5"]
    rc, err = run_wide(changed, capsys)
    assert rc == 1
    assert ("wide fit: error: ckpt_path: the checkpoint was trained with other settings, and a resume continues the "
            "same run; lam: checkpoint 20.0 vs run 5.0; routing.ffn_group_size: checkpoint 32 vs run 64") in err
    # how it computes may change: gradient checkpointing, attention implementation
    same = [*argv, "--trainer.max_steps", "3", "--ckpt_path", ckpt, "--model.init_args.gradient_checkpointing", "true"]
    assert run_wide(same, capsys)[0] == 0
    assert torch.load(ckpt, weights_only=True)["global_step"] == 3


def test_a_run_failing_before_its_first_step_leaves_no_version_folder(tmp_path, tiny_model_dir, tiny_corpus,
                                                                      capsys):
    poison = ["--trainer.callbacks", "tests.reliability.faults.PoisonRouters", "--trainer.callbacks.at_step", "0"]
    argv = fit_args(tmp_path, tiny_model_dir, tiny_corpus, *SHORT, *csv_logger(tmp_path), *poison)
    rc, err = run_wide(argv, capsys)
    assert rc == 1 and "non-finite loss at step 0" in err
    assert "last good files" not in err, "there are none yet"
    assert not (tmp_path / "run").exists() or not list((tmp_path / "run").iterdir())


def test_no_adverts_or_false_warnings(tmp_path, tiny_model_dir, tiny_corpus, capsys, recwarn, monkeypatch):
    import sys

    # `wide` hands LightningCLI exactly sys.argv[1:]: no "args parameter" warning for that
    argv = fit_args(tmp_path, tiny_model_dir, tiny_corpus, *SHORT, "--trainer.logger", "[{class_path: "
                    f"lightning.pytorch.loggers.TensorBoardLogger, init_args: {{save_dir: {tmp_path}}}}}, "
                    f"{{class_path: lightning.pytorch.loggers.CSVLogger, init_args: {{save_dir: {tmp_path}}}}}]")
    monkeypatch.setattr(sys, "argv", ["wide", *argv])
    from wide.cli import main

    capsys.readouterr()
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "Tip:" not in out + err
    messages = [str(w.message) for w in recwarn]
    assert not [m for m in messages if "exists and is not empty" in m or "args parameter" in m], messages
    assert (tmp_path / "lightning_logs/version_0/metrics.csv").is_file(), "CSV files share the TensorBoard folder"
