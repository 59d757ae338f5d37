"""``wide data arithmetic``: synthetic problems in the scored set's shapes, none of its questions, exact answers."""

import json
import re

import pytest

from tests.eval.fakes import write_saved_dataset
from wide.data.arithmetic import arithmetic_documents, arithmetic_main, scored_patterns
from wide.data.sources import load_documents

LINE = re.compile(r"^Calculate (\d+) ([-+*/]) (\d+) = (-?\d+)$")


@pytest.fixture
def scored(tmp_path):
    rows = [{"id": "q1_1d2d_max2d_minus", "question": "Calculate 0 - 42 =", "answerKey": "A", "type_tag": "easy"},
            {"id": "q2_1d2d_max2d_minus", "question": "Calculate 3 - 17 =", "answerKey": "A", "type_tag": "easy"},
            {"id": "q3_3d2d_max3d_mult", "question": "Calculate 511 * 16 =", "answerKey": "A", "type_tag": "hard"},
            {"id": "q4_4d2d_max4d_div", "question": "Calculate 4788 / 84 =", "answerKey": "A", "type_tag": "hard"},
            {"id": "q5_1d1d_max1d_plus", "question": "Calculate 5 + 4 =", "answerKey": "A", "type_tag": "easy"}]
    path = tmp_path / "basic_arithmetic"
    write_saved_dataset(path, rows)
    return path, {r["question"] for r in rows}


def _digits(n: int) -> int:
    return len(str(n))


def test_problems_follow_the_scored_shapes_with_exact_answers_and_no_scored_question(scored):
    path, questions = scored
    patterns, got_questions = scored_patterns(str(path))
    assert got_questions == questions
    assert patterns == {(1, 2, "minus"): 2, (3, 2, "mult"): 1, (4, 2, "div"): 1, (1, 1, "plus"): 1}
    docs = arithmetic_documents(300, 4, seed=3, data_dir=str(path))
    assert len(docs) == 300 and arithmetic_documents(300, 4, seed=3, data_dir=str(path)) == docs
    lines = [line for d in docs for line in d.split("\n\n")]
    assert len(lines) == 1200 and len(set(lines)) == 1200
    ops = {"+": "plus", "-": "minus", "*": "mult", "/": "div"}
    seen = set()
    for line in lines:
        a, op, b, value = LINE.match(line).groups()
        a, b, value = int(a), int(b), int(value)
        assert line.rsplit(" ", 1)[0] not in questions
        assert value == {"+": a + b, "-": a - b, "*": a * b, "/": a // max(b, 1)}[op]
        if op == "/":
            assert b > 0 and a % b == 0
        seen.add((_digits(a), _digits(b), ops[op]))
    assert seen == set(patterns)  # every shape drawn, no other


def test_cli_writes_a_jsonl_that_sources_read(scored, tmp_path, capsys):
    path, _ = scored
    out = tmp_path / "data" / "arith.jsonl"
    assert arithmetic_main(["--out", str(out), "--docs", "20", "--per-doc", "3", "--data-dir", str(path)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 20 and all(r["text"].count("\n\n") == 2 for r in rows)
    assert load_documents(str(out)) == [r["text"] for r in rows]
    assert "20 documents, 60 problems" in capsys.readouterr().err


@pytest.mark.parametrize("argv, field", [(["--out", "x.txt"], "out"), (["--out", "x.jsonl", "--docs", "0"], "docs")])
def test_bad_input_names_the_field_and_writes_nothing(scored, tmp_path, capsys, argv, field, monkeypatch):
    path, _ = scored
    monkeypatch.chdir(tmp_path)
    assert arithmetic_main([*argv, "--data-dir", str(path)]) == 2
    assert f"error: {field}" in capsys.readouterr().err
    assert not list(tmp_path.glob("x.*"))


def test_too_many_problems_for_the_shapes_is_refused(tmp_path):
    path = tmp_path / "tiny"
    write_saved_dataset(path, [{"id": "q1_1d1d_max1d_plus", "question": "Calculate 1 + 1 =", "answerKey": "A"}])
    with pytest.raises(ValueError, match="docs: only 99 distinct"):
        arithmetic_documents(200, 1, data_dir=str(path))
    unnamed = tmp_path / "unnamed"
    write_saved_dataset(unnamed, [{"id": "q1", "question": "Calculate 1 + 1 =", "answerKey": "A"}])
    with pytest.raises(ValueError, match="no item id"):
        scored_patterns(str(unnamed))
