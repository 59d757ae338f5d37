"""The optional lm-evaluation-harness bridge agrees with wide's own scoring (skipped without lm_eval)."""

import pytest

from wide.eval.tasks import DEFAULT_TASKS


def test_missing_lm_eval_is_a_clear_error(monkeypatch, tiny_model_dir, capsys):
    import wide.eval.harness as harness
    from wide.cli import main

    monkeypatch.setattr(harness, "available", lambda: False)
    assert main(["eval", tiny_model_dir, "--lm-eval", "--device", "cpu"]) == 2
    assert "pip install lm_eval" in capsys.readouterr().err


def test_lm_eval_matches_wide_scoring(olmo_cache, tiny_model_dir, monkeypatch):
    pytest.importorskip("lm_eval")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    import wide
    from wide.eval import EvalSettings, evaluate
    from wide.eval.harness import run_lm_eval
    from wide.io import load_model

    loaded = load_model(tiny_model_dir, routing=wide.WideConfig(router="topk", attn_group_size=2, ffn_group_size=32),
                        device="cpu")
    ours = evaluate(loaded, EvalSettings(tasks=list(DEFAULT_TASKS), limit=4, ppl_source="none"), log=lambda m: None)
    theirs = run_lm_eval(loaded, list(DEFAULT_TASKS), limit=4)
    for task in DEFAULT_TASKS:
        for metric in ("acc", "acc_norm"):
            if metric in ours["tasks"][task]:
                assert ours["tasks"][task][metric] == pytest.approx(theirs[task][metric]), (task, metric)
    assert theirs["sparsity"]["sparsity"] > 0
