"""`wide eval` is sized by its flags: --limit bounds perplexity too (first N documents), unless a perplexity flag
says otherwise."""

import json

import pytest

from wide.cli import main


@pytest.fixture
def prose(tmp_path):
    from tests.conftest import TINY_TEXT

    words = TINY_TEXT.split()
    path = tmp_path / "held_out.txt"
    path.write_text("\n\n".join(" ".join(words[i:] + words[:i]) for i in range(12)))
    return str(path)


def _ppl(capsys, tiny_model_dir, prose, out, *flags):
    rc = main(["eval", tiny_model_dir, "--tasks", "none", "--ppl-source", prose, "--ppl-window", "32",
               "--device", "cpu", "--output", str(out), "--quiet", *flags])
    err = capsys.readouterr().err
    assert rc == 0, err
    return json.loads((out / "results.json").read_text())["perplexity"], err


def test_limit_bounds_perplexity_documents(tiny_model_dir, prose, tmp_path, capsys):
    whole, _ = _ppl(capsys, tiny_model_dir, prose, tmp_path / "all")
    assert whole["documents"] == 12
    limited, err = _ppl(capsys, tiny_model_dir, prose, tmp_path / "lim", "--limit", "4")
    assert limited["documents"] == 4 and limited["tokens"] < whole["tokens"]
    assert "of 4 documents" in err
    assert "Perplexity on the first 4 documents" in (tmp_path / "lim" / "results.md").read_text()
    again, _ = _ppl(capsys, tiny_model_dir, prose, tmp_path / "sep", "--limit", "4", "--ppl-limit", "2")
    assert again["documents"] == 2
    free, _ = _ppl(capsys, tiny_model_dir, prose, tmp_path / "free", "--limit", "4", "--ppl-limit", "all")
    assert free["documents"] == whole["documents"] and free["tokens"] == whole["tokens"]
    capped, _ = _ppl(capsys, tiny_model_dir, prose, tmp_path / "cap", "--limit", "4", "--ppl-max-tokens", "64")
    assert capped["documents"] == whole["documents"] and capped["stream_tokens"] == 64  # the token cap rules


@pytest.mark.parametrize("value", ["0", "many"])
def test_bad_ppl_limit_is_one_line(value, tmp_path, capsys):
    assert main(["eval", "--ppl-limit", value, "--tasks", "none", "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("wide eval: error: ppl-limit:") and len(err.splitlines()) == 1
