"""The ``mixture`` source: weights parsed and checked up front, a deterministic weighted interleave, and the
default corpus's held-out documents left out."""

from __future__ import annotations

import pytest

from wide.data.mixture import DEFAULT_MIXTURE, interleave, mixture_documents, parse_mixture
from wide.data.sources import check_source, source_kind


def test_parse_mixture_defaults_and_named_weights():
    assert parse_mixture("mixture") == DEFAULT_MIXTURE
    assert parse_mixture("mixture:lambada=2, coqa") == {"lambada": 2.0, "coqa": 1.0}
    assert source_kind("mixture:drop=0.5") == "mixture"


@pytest.mark.parametrize("source, message", [
    ("mixture:wiki=1", "'wiki' is not a named corpus"),
    ("mixture:coqa=x", "weight 'x' of coqa is not a number"),
    ("mixture:coqa=0", "weight of coqa must be > 0"),
    ("mixture:coqa,coqa=2", "coqa is given twice"),
])
def test_bad_mixtures_fail_before_reading(source, message):
    with pytest.raises(ValueError, match=message):
        check_source(source)


def test_interleave_keeps_the_weights_in_every_prefix_and_uses_every_document_once():
    corpora = {"a": [f"a{i:03d}" * 5 for i in range(200)], "b": [f"b{i:03d}" * 5 for i in range(50)],
               "c": [f"c{i:03d}" * 10 for i in range(300)]}
    weights = {"a": 1.0, "b": 1.0, "c": 2.0}
    out = interleave(corpora, weights)
    assert sorted(out) == sorted(d for docs in corpora.values() for d in docs)
    assert out == interleave(corpora, weights)
    for n in (20, 80, 150):  # b (1,000 characters) runs out after 200 documents
        chars = {k: sum(len(d) for d in out[:n] if d[0] == k) for k in corpora}
        total = sum(chars.values())
        for k, w in weights.items():  # off by at most one document
            assert abs(chars[k] / total - w / 4) <= 40 / total, (n, chars)
    for k, docs in corpora.items():  # each corpus in its own order
        assert [d for d in out if d[0] == k] == docs


def test_mixture_leaves_out_the_default_corpus_held_out_documents(monkeypatch):
    import wide.data.corpus as corpus
    import wide.data.olmo as olmo

    docs = {name: [f"{name} document {i}" for i in range(20)] for name in DEFAULT_MIXTURE}
    monkeypatch.setattr(olmo, "prose_corpus", lambda name: docs[name])
    held_out = ["boolq document 3", "boolq document 7"]
    monkeypatch.setattr(corpus, "default_corpus_split", lambda: (["boolq document 0"], held_out))
    out = mixture_documents("mixture")
    assert len(out) == 100 - 2 and not set(held_out) & set(out)
    assert {d.split()[0] for d in out[:5]} == set(DEFAULT_MIXTURE)
    assert mixture_documents("mixture:drop=1,squad=3")[:4] == ["drop document 0", "squad document 0",
                                                               "squad document 1", "squad document 2"]


def test_a_mixture_takes_local_files_and_folders_beside_the_corpora(monkeypatch, tmp_path):
    """`wide data generate`'s shards (jsonl rows with ``text``) mix with prose corpora by weight of characters."""
    import json

    import wide.data.corpus as corpus
    import wide.data.olmo as olmo

    monkeypatch.setattr(olmo, "prose_corpus", lambda name: [f"{name} document {i} " * 4 for i in range(10)])
    monkeypatch.setattr(corpus, "default_corpus_split", lambda: ([], []))
    shards = tmp_path / "chat"
    shards.mkdir()
    rows = [{"text": f"chat answer {i} " * 4} for i in range(30)]
    (shards / "shard-00000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    source = f"mixture:drop=1,{shards}=1"
    assert parse_mixture(source) == {"drop": 1.0, str(shards): 1.0}
    assert source_kind(source) == "mixture"
    out = mixture_documents(source)
    assert len(out) == 40 and [d for d in out if d.startswith("chat")] == [r["text"].strip() for r in rows]
    assert [d.split()[0] for d in out[:2]] == ["drop", "chat"]  # ties go to the first named
    first = out[:16]  # equal weights: equal characters, within one document, while both last
    chars = {k: sum(len(d) for d in first if d.startswith(k)) for k in ("drop", "chat")}
    assert abs(chars["drop"] - chars["chat"]) <= 64


def test_a_mixture_path_that_holds_nothing_fails_before_reading(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="nor an existing file or folder"):
        check_source(f"mixture:drop=1,{tmp_path / 'missing'}=1")
    with pytest.raises(ValueError, match="empty"):
        check_source(f"mixture:drop=1,{tmp_path / 'empty'}=1")


def _fake_arithmetic(monkeypatch, tmp_path, docs: int = 40):
    import wide.data.arithmetic as arithmetic
    import wide.data.corpus as corpus
    import wide.data.mixture as mixture
    import wide.data.olmo as olmo
    from tests.eval.fakes import write_saved_dataset

    scored = tmp_path / "basic_arithmetic"
    write_saved_dataset(scored, [{"id": "q1_2d2d_max2d_plus", "question": "Calculate 10 + 10 =", "answerKey": "A"}])
    monkeypatch.setattr(olmo, "task_data_dir", lambda task: scored)
    monkeypatch.setattr(olmo, "prose_corpus", lambda name: [f"{name} document {i} " * 4 for i in range(50)])
    monkeypatch.setattr(corpus, "default_corpus_split", lambda: ([], []))
    monkeypatch.setattr(mixture, "ARITHMETIC_DOCS", docs)
    return lambda n: arithmetic.arithmetic_documents(n, 8, seed=0, data_dir=str(scored))


def _chars(docs, prefix=None):
    return sum(len(d) for d in docs if prefix is None or d.startswith(prefix))


def test_a_mixture_takes_the_synthetic_arithmetic_corpus(monkeypatch, tmp_path):
    """``arithmetic`` (`wide.data.arithmetic`) mixes in by characters like a prose corpus, none of its scored questions."""
    generate = _fake_arithmetic(monkeypatch, tmp_path)
    assert parse_mixture("mixture:drop,arithmetic=0.5") == {"drop": 1.0, "arithmetic": 0.5}
    out = mixture_documents("mixture:drop,arithmetic=0.5")
    arith = [d for d in out if d.startswith("Calculate")]
    assert arith == generate(40)[:len(arith)]  # the generator's first documents
    assert all(line != "Calculate 10 + 10 = 20" for d in arith for line in d.split("\n\n"))
    head = out[:30]
    chars = {k: _chars(head, k) for k in ("drop", "Calculate")}
    assert abs(chars["Calculate"] / sum(chars.values()) - 1 / 3) < 0.1


@pytest.mark.parametrize("weight", [0.02, 0.1, 0.5, 30.0])
def test_the_arithmetic_corpus_is_sized_to_its_weight_over_a_whole_pass(monkeypatch, tmp_path, weight):
    """Every document of a mixture is used once a pass, so the generated corpus is cut (or extended) to its weight's
    share of the whole stream: a fixed size gave ``arithmetic=0.1`` and ``=0.02`` the same ~20% (2026-12-07)."""
    generate = _fake_arithmetic(monkeypatch, tmp_path, docs=40)
    out = mixture_documents(f"mixture:drop,squad=3,arithmetic={weight}")
    arith = [d for d in out if d.startswith("Calculate")]
    prose = _chars(out) - _chars(arith)
    want = weight * prose / 4  # the other corpora's characters per unit of their weights (1 + 3)
    longest = max(len(d) for d in generate(len(arith)))
    assert want <= _chars(arith) < want + longest  # reached, by less than one document more
    assert arith == generate(len(arith))  # a prefix of the same stream, past ARITHMETIC_DOCS where it asks more
    assert len(arith) > 40 if weight == 30.0 else len(arith) < 40


def test_the_arithmetic_corpus_alone_keeps_its_fixed_size(monkeypatch, tmp_path):
    generate = _fake_arithmetic(monkeypatch, tmp_path, docs=12)
    assert mixture_documents("mixture:arithmetic=2") == generate(12)


def test_a_mixture_reports_each_corpus_share_of_a_pass_beside_its_weight(monkeypatch, tmp_path, caplog):
    """The weights order the stream; the shares a fit trains on are the corpora's sizes (and the sized arithmetic)."""
    import logging

    _fake_arithmetic(monkeypatch, tmp_path)
    with caplog.at_level(logging.INFO):
        out = mixture_documents("mixture:drop,squad=3,arithmetic=0.4")
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("wide mixture:"))
    drop, squad = (_chars(out, k) / _chars(out) for k in ("drop", "squad"))
    assert f"drop {drop:.1%} (weight {1 / 4.4:.1%})" in line and f"squad {squad:.1%} (weight {3 / 4.4:.1%})" in line
    assert "arithmetic " in line and "every document is used once a pass" in line
