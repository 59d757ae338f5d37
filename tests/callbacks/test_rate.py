"""`RateCalibration`: a fit ends with its routers' noise-free rate on the target, logged; ``enabled: false`` keeps
the routers as trained."""

import csv

import pytest
import torch
from safetensors.torch import load_file

from tests.reliability.conftest import fit_args, run_wide
from wide.callbacks import RateCalibration

RUN = ["--model.init_args.routing.sparsity", "0.25", "--model.init_args.routing.sparsity_measure", "weight",
       "--trainer.max_steps", "6", "--model.init_args.lr", "0.02", "--trainer.val_check_interval", "6",
       "--trainer.limit_val_batches", "4", "--data.max_val_tokens", "256", "--trainer.log_every_n_steps", "1",
       "--sparsity_monitor.heatmap_every_n_steps", "0"]  # fmt: skip
# 256 held-out tokens: 8 rows of 32, 4 batches of 2; the calibration measures them all, so does the last validation


def _metrics(out) -> dict[str, float]:
    """The last logged value of each metric in a run's ``metrics.csv``."""
    last: dict[str, float] = {}
    for row in csv.DictReader(open(next(out.rglob("metrics.csv")))):
        last.update({k: float(v) for k, v in row.items() if v and k not in ("step", "epoch")})
    return last


def _fit(tmp_path, name, model_dir, corpus, capsys, *extra):
    out = tmp_path / name
    logger = f'{{"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {{"save_dir": "{out}/logs"}}}}'
    rc, err = run_wide(fit_args(out, model_dir, corpus, *RUN, "--trainer.logger", logger, *extra), capsys)
    assert rc == 0, err[-3000:]
    return out, err


def test_a_fit_ends_on_the_target_rate_and_the_switch_keeps_the_routers_as_trained(tmp_path, tiny_model_dir,
                                                                                 tiny_corpus, capsys):
    on, err = _fit(tmp_path, "on", tiny_model_dir, tiny_corpus, capsys)
    assert "wide: rate calibration on 4 held-out batches per rank: noise-free skip rate by routed weight" in err
    logs = _metrics(on)
    assert logs["rate_fit/target"] == 0.25 and abs(logs["rate_fit/after"] - 0.25) <= 0.002, logs
    assert abs(logs["rate_fit/before"] - 0.25) > 0.002  # there was something to fix
    # the last validation ran after the shift, over the same held-out tokens
    assert abs(logs["sparsity/val/by_weight"] - logs["rate_fit/after"]) < 1e-5

    off, err = _fit(tmp_path, "off", tiny_model_dir, tiny_corpus, capsys, "--rate_calibration.enabled", "false")
    assert "rate calibration" not in err and not any(k.startswith("rate_fit/") for k in _metrics(off))
    assert abs(_metrics(off)["sparsity/val/by_weight"] - logs["rate_fit/before"]) < 1e-5  # the rate as trained
    # the same training; the written routers differ by the shift of their execute logits only
    a, b = (load_file(out / "wide/routers.safetensors") for out in (on, off))
    assert a.keys() == b.keys()
    shift = logs["rate_fit/shift"]
    for name in a:
        if name.endswith("up.bias"):
            torch.testing.assert_close(a[name][0::2] - b[name][0::2], torch.full_like(b[name][0::2], shift))
            assert torch.equal(a[name][1::2], b[name][1::2])
        else:
            assert torch.equal(a[name], b[name]), name


def test_bad_settings_name_the_argument():
    with pytest.raises(ValueError, match="^batches: must be a positive integer"):
        RateCalibration(batches=0)
    with pytest.raises(ValueError, match="^tolerance: must be in"):
        RateCalibration(tolerance=0.0)
    with pytest.raises(ValueError, match="^max_passes: must be an integer >= 2"):
        RateCalibration(max_passes=1)
