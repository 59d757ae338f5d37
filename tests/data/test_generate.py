"""`wide data generate`: a tiny model writes valid, resumable jsonl shards that `wide fit` trains on."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.reliability.conftest import fit_args, run_wide

CHAT_TEMPLATE = ("{% for m in messages %}<bos>{{ m['role'] }}: {{ m['content'] }}<eos>\n{% endfor %}"
                 "{% if add_generation_prompt %}<bos>assistant:{% endif %}")


def _generate(capsys, *argv) -> tuple[int, str]:
    from wide.cli import main

    capsys.readouterr()
    rc = main(["data", "generate", *argv])
    return rc, capsys.readouterr().err


def _rows(folder) -> list[dict]:
    return [json.loads(line) for p in sorted(folder.glob("shard-*.jsonl")) for line in p.read_text().splitlines()]


def _rotated_corpus(path) -> str:
    """40 documents that differ from their first token on (the tiny tokenizer knows few characters)."""
    from tests.conftest import TINY_TEXT

    words = TINY_TEXT.split()
    path.write_text("\n\n".join(" ".join(words[i:] + words[:i]) for i in range(40)))
    return str(path)


def test_continuations_make_resumable_shards_that_fit_reads(tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "gen"
    args = [tiny_model_dir, "--source", _rotated_corpus(tmp_path / "docs.txt"), "--out", str(out), "--prompt-tokens", "8",
            "--max-new-tokens", "12", "--shard-size", "7", "--max-prompts", "20", "--batch-size", "4"]
    rc, err = _generate(capsys, *args)
    assert rc == 0, err
    shards = sorted(out.glob("shard-*.jsonl"))
    assert [p.name for p in shards] == ["shard-00000.jsonl", "shard-00001.jsonl", "shard-00002.jsonl"]
    rows = _rows(out)
    assert len(rows) == 20 and all(r["text"] == r["prompt"] + r["completion"] and r["prompt"] for r in rows)
    assert sum(bool(r["completion"]) for r in rows) > 10
    manifest = json.loads((out / "generate.json").read_text())
    assert manifest["prompts"] == 20 and manifest["shards"] == 3

    # resumable: shards already there are skipped; a missing one is made again, the same (greedy)
    before = {p.name: (p.read_text(), p.stat().st_mtime_ns) for p in shards}
    shards[1].unlink()
    rc, err = _generate(capsys, *args)
    assert rc == 0 and "1 written, 2 already there" in err
    after = {p.name: (p.read_text(), p.stat().st_mtime_ns) for p in sorted(out.glob("shard-*.jsonl"))}
    assert after["shard-00000.jsonl"] == before["shard-00000.jsonl"]
    assert after["shard-00001.jsonl"][0] == before["shard-00001.jsonl"][0]
    assert not list(out.glob(".*.tmp"))
    rc, err = _generate(capsys, *args[:-2], "--batch-size", "4", "--temperature", "0.7")
    assert rc == 2 and "holds shards made with other settings (temperature: 0.0 vs 0.7)" in err

    # wide fit reads the folder
    rc, err = run_wide(fit_args(tmp_path / "fit", tiny_model_dir, str(out), "--trainer.max_steps", "2",
                                "--data.val_docs", "0", "--trainer.limit_val_batches", "0"), capsys)
    assert rc == 0, err[-3000:]
    assert (tmp_path / "fit/wide/routers.safetensors").is_file()


def test_chat_answers_render_the_conversation(tmp_path, tiny_model_dir, capsys):
    model = tmp_path / "chat-model"
    shutil.copytree(tiny_model_dir, model)
    cfg = json.loads((model / "tokenizer_config.json").read_text())
    (model / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    (model / "tokenizer_config.json").write_text(json.dumps(cfg))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"What does the fox do {i}?"}) + "\n" for i in range(5)))
    out = tmp_path / "chat"
    rc, err = _generate(capsys, str(model), "--chat", "--prompt-file", str(prompts), "--out", str(out),
                        "--max-new-tokens", "6", "--temperature", "0.8", "--seed", "1")
    assert rc == 0, err
    rows = _rows(out)
    assert [r["prompt"] for r in rows] == [f"What does the fox do {i}?" for i in range(5)]
    for r in rows:
        assert r["text"] == f"<bos>user: {r['prompt']}<eos>\n<bos>assistant: {r['completion']}<eos>\n"


@pytest.mark.parametrize("argv, message", [
    (["--max-new-tokens", "0"], "max-new-tokens: must be >= 1"),
    (["--length-spread", "-1"], "length-spread: must be >= 0"),
    (["--prompt-file", "x.txt"], "prompt-file/questions/system: chat prompts need --chat"),
    (["--chat"], "has no chat template"),
    (["--source", "missing.txt"], "source='missing.txt' does not exist"),
])
def test_bad_input_fails_with_one_message(tmp_path, tiny_model_dir, capsys, argv, message):
    rc, err = _generate(capsys, tiny_model_dir, "--out", str(tmp_path / "o"), *argv)
    assert rc == 2 and message in err, err
