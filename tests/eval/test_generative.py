"""Generative metrics of `wide eval`: arithmetic exact match and agreement with the dense model, on fabricated
fixtures (tiny models, the fabricated asset), with realized sparsity kinds-averaged and by weight."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

import wide
from tests.conftest import tiny_model
from wide.cli import main
from wide.eval import generative as G


def _tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


class CharTokenizer:
    """Characters as tokens (ASCII + 3): the tiny BPE tokenizer cannot spell newlines or digits reliably."""

    eos_token_id, pad_token_id, chat_template = 1, 0, None

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(c) + 3 for c in text]}

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i - 3) for i in ids if i >= 3)


def test_arithmetic_scores_the_first_integer_of_the_first_line(olmo_cache, monkeypatch):
    tok = CharTokenizer()
    items = G._arithmetic_items(None)[G.SHOTS:]
    replies = []
    for k, (_, answer) in enumerate(items):  # right, right with chatter, wrong, right on the second line only
        replies.append([f" {answer}\n", f" {answer} yes", f" {int(answer) + 1}\n{answer}", f"\n{answer}"][k % 4])

    def fake_generate(model, prompts, **kw):
        assert [tok.decode(p).count("\n\n") for p in prompts] == [G.SHOTS] * len(items)
        assert [tok.decode(p).rsplit("\n\n", 1)[1] for p in prompts] == [q for q, _ in items]
        return [tok(r)["input_ids"] for r in replies]

    monkeypatch.setattr("wide.modeling.batched.generate_many", fake_generate)
    res = G.arithmetic(tiny_model("llama", vocab_size=256), tok)
    expected = sum(1 for k in range(len(items)) if k % 4 in (0, 1)) / len(items)
    assert res["n"] == len(items) == 12 - G.SHOTS and res["exact_match"] == pytest.approx(expected)
    assert res["sparsity"]["sparsity"] == 0.0  # a dense model skips nothing


def test_agreement_of_a_model_with_itself_is_complete(tiny_model_dir):
    tok = _tokenizer(tiny_model_dir)
    model = tiny_model("llama", vocab_size=max(96, len(tok)))
    loaded = SimpleNamespace(model=model, tokenizer=tok, info={"checkpoint": None})
    reference, kind = G.dense_reference(loaded)
    res = G.agreement(model, tok, reference=reference, reference_kind=kind, questions=["the fox", "a model", "dog"],
                      max_new_tokens=8, agree_tokens=5)
    assert kind == "itself (dense)" and res["n"] == 3
    assert res["token_agreement"] == 1.0 and res["exact_match"] == 1.0 and res["prefix_tokens"] == 5.0


def test_routed_reference_is_the_same_model_with_routing_off(tiny_model_dir):
    tok = _tokenizer(tiny_model_dir)
    dense = tiny_model("llama", vocab_size=max(96, len(tok)))
    routed = wide.apply_wide(tiny_model("llama", vocab_size=max(96, len(tok))),
                             wide.WideConfig(router="topk", sparsity=0.5, attn_group_size=2, ffn_group_size=32)).eval()
    loaded = SimpleNamespace(model=routed, tokenizer=tok, info={"checkpoint": {"adapter_merged": False}})
    reference, kind = G.dense_reference(loaded)
    prompts = [tok("the quick brown fox")["input_ids"], tok("routers")["input_ids"]]
    assert kind == "routing off"
    from wide.modeling.batched import generate_many

    assert reference(prompts, 6) == generate_many(dense, prompts, max_new_tokens=6, stop_ids=[tok.eos_token_id])
    res = G.agreement(routed, tok, reference=reference, reference_kind=kind, questions=["the fox", "lazy dog"],
                      max_new_tokens=6, agree_tokens=4)
    assert 0 <= res["token_agreement"] <= 1 and res["sparsity"]["sparsity"] == pytest.approx(0.5)
    assert 0 < res["sparsity"]["by_weight"] < 1


def test_merged_lora_reference_loads_the_base_model(tiny_model_dir, monkeypatch):
    tok = _tokenizer(tiny_model_dir)
    routed = wide.apply_wide(tiny_model("llama", vocab_size=max(96, len(tok))),
                             wide.WideConfig(router="topk", attn_group_size=2, ffn_group_size=32)).eval()
    dense = tiny_model("llama", seed=1, vocab_size=max(96, len(tok)))
    loads = []

    def fake_load(name, **kw):
        loads.append((name, kw["device"], kw["dtype"]))
        return SimpleNamespace(model=dense)

    monkeypatch.setattr("wide.io.loading.load_model", fake_load)
    info = {"model": "base", "device": "cpu", "dtype": "float32", "checkpoint": {"adapter_merged": True}}
    reference, kind = G.dense_reference(SimpleNamespace(model=routed, tokenizer=tok, info=info))
    prompts = [tok("the lazy dog")["input_ids"]]
    from wide.modeling.batched import generate_many

    assert kind == "dense base model"
    assert reference(prompts, 5) == generate_many(dense, prompts, max_new_tokens=5, stop_ids=[tok.eos_token_id])
    assert loads == [("base", "cpu", "float32")]


def test_eval_reports_generative_metrics_next_to_sparsity(olmo_cache, tiny_model_dir, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("What does the fox do?\nWhich model skips heads?\nWho trains routers?\n")
    out = tmp_path / "ev"
    rc = main(["eval", "--model", tiny_model_dir, "--router", "topk", "--sparsity", "0.5", "--attn-group-size", "2",
               "--ffn-group-size", "32", "--tasks", "none", "--ppl-source", "none", "--generative", "all",
               "--gen-prompts", str(prompts), "--limit", "5", "--gen-limit", "2", "--gen-max-new-tokens", "6", "--agree-tokens", "4",
               "--device", "cpu", "--output", str(out)])
    io = capsys.readouterr()
    assert rc == 0, io.err
    result = json.loads((out / "results.json").read_text())
    arith, agree = result["generative"]["arithmetic"], result["generative"]["agreement"]
    assert arith["n"] == 2 and agree["n"] == 2 and agree["reference"] == "routing off"
    for r in (arith, agree):
        assert r["sparsity"]["sparsity"] == pytest.approx(0.5) and 0 < r["sparsity"]["by_weight"] < 1
    summary = result["summary"]["generative"]
    assert summary["arithmetic_em"] == arith["exact_match"] and summary["token_agreement"] == agree["token_agreement"]
    assert "basic arithmetic, 5-shot greedy: exact match | 2 |" in io.out
    assert "agreement with the dense model (routing off): first 4 tokens | 2 |" in io.out


@pytest.mark.parametrize("args, message", [
    (["--generative", "poetry"], "generative: unknown poetry"),
    (["--generative", "agreement", "--agree-tokens", "0"], "agree-tokens: must be >= 1"),
    (["--generative", "arithmetic", "--gen-limit", "0"], "gen-limit: must be >= 1"),
    (["--generative", "agreement", "--gen-prompts", "missing.txt"], "prompt-file: missing.txt is not a file"),
])
def test_bad_generative_flags_fail_before_loading(tiny_model_dir, capsys, args, message):
    rc = main(["eval", tiny_model_dir, "--device", "cpu", *args])
    assert rc == 2 and message in capsys.readouterr().err


def test_eval_with_dense_prompts_routes_and_counts_the_answers_only(olmo_cache, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "ev"
    rc = main(["eval", "--model", tiny_model_dir, "--router", "topk", "--sparsity", "0.5", "--attn-group-size", "2",
               "--ffn-group-size", "32", "--tasks", "none", "--ppl-source", "none", "--generative", "arithmetic",
               "--gen-limit", "3", "--gen-prefill", "dense", "--device", "cpu", "--output", str(out)])
    io = capsys.readouterr()
    assert rc == 0, io.err
    result = json.loads((out / "results.json").read_text())
    arith = result["generative"]["arithmetic"]
    assert result["settings"]["gen_prefill"] == "dense" and arith["prefill"] == "dense" and arith["n"] == 3
    # only the answers' decode steps were counted: a few tokens, not the 5-shot prompts' hundreds
    assert arith["sparsity"]["tokens"] <= 3 * (arith["max_new_tokens"] - 1)
    assert "Prompts ran dense (`--gen-prefill dense`" in io.out


def test_bad_gen_prefill_is_named(tiny_model_dir, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["eval", tiny_model_dir, "--device", "cpu", "--generative", "arithmetic", "--gen-prefill", "sparse"])
    assert exc.value.code == 2 and "--gen-prefill: invalid choice: 'sparse'" in capsys.readouterr().err
