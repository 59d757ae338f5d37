"""Numerical faults stop the run with a message naming the step, and never overwrite the last good files."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

import wide
from tests.conftest import tiny_model
from tests.reliability.conftest import fit_args, run_wide
from wide.io.checkpoint import read_metadata, save_trained

RUN = ["--trainer.max_steps", "8", "--wide_checkpoint.every_n_steps", "2", "--trainer.limit_val_batches", "0"]


def _poison(at_step: int, where: str) -> list[str]:
    return ["--trainer.callbacks", "tests.reliability.faults.PoisonRouters", "--trainer.callbacks.at_step",
            str(at_step), "--trainer.callbacks.where", where]


def _assert_last_good(out, step: int) -> None:
    meta = read_metadata(out / "wide/routers.safetensors")
    assert meta["step"] == step
    assert all(torch.isfinite(t).all() for t in load_file(out / "wide/routers.safetensors").values())
    ckpt = torch.load(out / "wide/last.ckpt", weights_only=True)
    assert ckpt["global_step"] == step and all(torch.isfinite(t).all() for t in ckpt["state_dict"].values())
    assert not (out / "wide" / f"step-{step + 2:06d}.safetensors").exists()


def test_nan_loss_stops_naming_the_step_and_keeps_last_good_files(tmp_path, tiny_model_dir, tiny_corpus, capsys):
    rc, err = run_wide(fit_args(tmp_path, tiny_model_dir, tiny_corpus, *RUN, *_poison(3, "forward")), capsys)
    assert rc == 1
    line = next(line for line in err.splitlines() if line.startswith("wide fit: error: "))
    assert "non-finite loss at step 3" in line and str(tmp_path / "wide") in line and "--ckpt_path last" in line
    _assert_last_good(tmp_path, 2)


def test_nan_weights_are_never_written(tmp_path, tiny_model_dir, tiny_corpus, capsys):
    # the optimizer step of step 4 leaves a NaN weight with a finite loss: the step-4 save must refuse it
    rc, err = run_wide(fit_args(tmp_path, tiny_model_dir, tiny_corpus, *RUN, *_poison(4, "weights")), capsys)
    assert rc == 1 and "non-finite trained tensors at step 4" in err and "keeps the last good state" in err
    _assert_last_good(tmp_path, 2)


def test_a_crash_while_writing_leaves_the_previous_file(tmp_path, monkeypatch):
    cfg = wide.WideConfig(attn_group_size=2, ffn_group_size=32)
    model = wide.apply_wide(tiny_model("llama", num_hidden_layers=2), cfg)
    path = save_trained(model, tmp_path / "routers.safetensors", config=cfg, stage="calibrate", step=1)
    before = path.read_bytes()

    def dies_halfway(state, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"partial")
        raise KeyboardInterrupt  # what a kill during the write looks like from inside

    monkeypatch.setattr("wide.io.checkpoint.save_file", dies_halfway)
    with torch.no_grad():
        next(p for n, p in model.named_parameters() if "routers" in n).add_(1.0)
    with pytest.raises(KeyboardInterrupt):
        save_trained(model, path, config=cfg, stage="calibrate", step=2)
    assert path.read_bytes() == before and read_metadata(path)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["routers.safetensors"], "no temp file is left behind"


def test_save_trained_refuses_non_finite_tensors(tmp_path):
    cfg = wide.WideConfig(attn_group_size=2, ffn_group_size=32)
    model = wide.apply_wide(tiny_model("llama", num_hidden_layers=2), cfg)
    with torch.no_grad():
        next(p for n, p in model.named_parameters() if "routers" in n).view(-1)[3] = float("inf")
    with pytest.raises(FloatingPointError, match="non-finite trained tensors at step 7 .*nothing was written"):
        save_trained(model, tmp_path / "r.safetensors", config=cfg, stage="calibrate", step=7)
    assert not list(tmp_path.iterdir())
