"""WideCheckpoint: arguments, default folder, and the resume file it writes (or not)."""

import pytest
import torch

from tests.reliability.conftest import fit_args, run_wide
from wide.callbacks import WideCheckpoint
from wide.io.checkpoint import read_metadata


def test_bad_cadence_names_the_argument():
    with pytest.raises(ValueError, match="^every_n_steps: must be an integer >= 0, got -1"):
        WideCheckpoint(every_n_steps=-1)


def test_default_folder_is_the_run_log_folder(tmp_path, tiny_model_dir, tiny_corpus, capsys):
    csv = f'{{"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {{"save_dir": "{tmp_path}"}}}}'
    argv = fit_args(tmp_path, tiny_model_dir, tiny_corpus, "--trainer.max_steps", "2",
                    "--trainer.limit_val_batches", "0", "--trainer.logger", csv)
    argv[argv.index("--wide_checkpoint.dirpath") + 1] = "null"
    assert run_wide(argv, capsys)[0] == 0
    out = tmp_path / "lightning_logs/version_0/wide"
    assert read_metadata(out / "routers.safetensors")["step"] == 2
    assert torch.load(out / "last.ckpt", weights_only=True)["global_step"] == 2, "the final state, to extend a run"


def test_no_resume_file_when_disabled(tmp_path, tiny_model_dir, tiny_corpus, capsys):
    argv = fit_args(tmp_path, tiny_model_dir, tiny_corpus, "--trainer.max_steps", "2", "--trainer.limit_val_batches",
                    "0", "--wide_checkpoint.every_n_steps", "1", "--wide_checkpoint.save_resume", "false")
    assert run_wide(argv, capsys)[0] == 0
    names = sorted(p.name for p in (tmp_path / "wide").iterdir())
    assert names == ["routers.safetensors", "step-000001.safetensors", "step-000002.safetensors"]
