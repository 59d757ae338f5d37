"""The `wide` command itself: the overview lists every command, answers without torch, and a typo in a recipe key
or a flag is one line naming it with the closest valid keys."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from wide.cli import SUBCOMMANDS, SUMMARIES, main

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes/smollm2-135m/calibrate.yaml"
EVERY = ("fit", "validate", "test", "eval", "export", "generate", "grid", "bench", "assets", "data")


@pytest.mark.parametrize("argv", [["--help"], []], ids=["help", "no-args"])
def test_overview_lists_every_command(argv, capsys):
    rc = main(argv)
    out = capsys.readouterr().out
    assert rc == (0 if argv else 2)
    lines = {line.split()[0] for line in out.splitlines() if line.startswith("  ") and line.split()}
    assert set(EVERY) <= lines
    assert set(SUMMARIES) == set(EVERY) and set(SUBCOMMANDS) <= set(SUMMARIES)


def test_help_and_light_commands_import_no_torch():
    code = ("import sys; from wide.cli import main; main(['--help']); main(['assets', 'list']); "
            "heavy = [m for m in ('torch', 'lightning', 'transformers') if m in sys.modules]; "
            "assert not heavy, heavy; import wide; assert 'torch' not in sys.modules")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "assets" in done.stdout


def test_lazy_package_keeps_its_names():
    import wide

    assert callable(wide.apply_wide) and wide.WideConfig().sparsity == 0.5
    assert set(wide.__all__) == set(wide._EXPORTS) and set(wide.__all__) <= set(dir(wide))
    with pytest.raises(AttributeError):
        wide.no_such_name


def test_unknown_command_suggests(capsys):
    assert main(["evl"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'evl'. Did you mean 'eval'?" in err and len(err.strip().splitlines()) == 1


def _fit_error(capsys, *argv):
    assert main(["fit", *argv]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err  # one line, no usage block
    return err


def test_yaml_typo_under_routing_names_key_and_suggests(tmp_path, capsys):
    cfg = yaml.safe_load(RECIPE.read_text())
    cfg["model"]["init_args"]["routing"]["lamda"] = 3
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(cfg))
    err = _fit_error(capsys, "--config", str(path))
    assert "model.init_args.routing.lamda: unknown key. Did you mean 'model.init_args.lam'?" in err


def test_yaml_typo_in_trainer_suggests(tmp_path, capsys):
    cfg = yaml.safe_load(RECIPE.read_text())
    cfg["trainer"]["max_step"] = 3
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(cfg))
    err = _fit_error(capsys, "--config", str(path))
    assert "trainer.max_step: unknown key. Did you mean 'trainer.max_steps'" in err


def test_flag_typos_suggest(capsys):
    err = _fit_error(capsys, "--config", str(RECIPE), "--data.sorce", "x.txt")
    assert "--data.sorce: unknown flag. Did you mean '--data.source'?" in err
    err = _fit_error(capsys, "--config", str(RECIPE), "--model.init_args.routing.sparsty", "0.3")
    assert "model.init_args.routing.sparsty: unknown key. Did you mean 'model.init_args.routing.sparsity'" in err


def test_fit_prints_no_adverts_and_reports_its_data(tmp_path, tiny_model_dir, tiny_corpus, capfd, monkeypatch):
    from tests.reliability.conftest import fit_args

    monkeypatch.chdir(tmp_path)
    argv = fit_args(tmp_path / "out", tiny_model_dir, tiny_corpus, "--trainer.max_steps", "1",
                    "--trainer.limit_val_batches", "1", "--trainer.val_check_interval", "1")
    i = argv.index("--trainer.logger")
    del argv[i:i + 2]  # the recipe's loggers: Lightning's cloud-logging advert came with them
    monkeypatch.setattr(sys, "argv", ["wide", *argv])  # as the console script runs: LightningCLI's args warning
    assert main(argv) == 0
    out, err = capfd.readouterr()
    text = out + err
    assert "Tip:" not in text and "args parameter" not in text
    assert "wide data: " in text and "documents" in text and "held-out" in text
