"""StepProgress and the end of a run: plain progress lines without a terminal, and a final validation and heatmap
however short the run."""

import re

from tests.reliability.conftest import fit_args
from wide.callbacks.progress import _duration


def test_a_three_step_run_prints_progress_lines_and_ends_validated_with_a_heatmap(tmp_path, tiny_model_dir,
                                                                                   tiny_corpus, capsys):
    # the recipe validates and draws heatmaps every 100 steps; pytest's stdout is no terminal: plain lines
    csv = f'{{"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {{"save_dir": "{tmp_path}"}}}}'
    argv = fit_args(tmp_path, tiny_model_dir, tiny_corpus, "--trainer.max_steps", "3", "--trainer.logger", csv,
                    "--trainer.limit_val_batches", "1", "--trainer.enable_progress_bar", "true")
    capsys.readouterr()
    from wide.cli import main

    assert main(argv) == 0
    out = capsys.readouterr().out
    steps = re.findall(r"^wide: step (\d)/3 \(\d+%\) \| [\d.]+ s/step \| [\d,]+ tok/s \| ETA \w+ \| loss [\d.]+",
                       out, re.M)
    assert steps == ["1", "2", "3"], out
    assert re.search(r"^wide: validation at step 3: val/loss [\d.]+ \| val/ppl [\d.]+ \| val/sparsity", out, re.M)
    assert "Epoch 0/-2" not in out and "\r" not in out, "no bar drawn into a log"
    run = tmp_path / "lightning_logs/version_0"
    assert (run / "heatmaps/step_000003.png").is_file(), "a heatmap at the last step"
    header, *rows = (run / "metrics.csv").read_text().splitlines()
    col = header.split(",").index("val/loss")
    assert [r.split(",")[col] for r in rows if r.split(",")[col]], "validation ran once, at the end"


def test_durations_read_like_a_clock():
    assert [_duration(s) for s in (5, 65, 3725)] == ["5s", "1m05s", "1h02m05s"]
