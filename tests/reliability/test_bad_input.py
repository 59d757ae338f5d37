"""Every bad input fails with one clear error, through the entry point a user calls, before any compute.

The ``wide fit`` cases run the console command in-process and check its exit status and its one
``wide fit: error: ...`` line; ``no_weights_loaded`` proves they fail before any weights are read.
"""

from __future__ import annotations

import subprocess

import pytest
import torch

import wide
from tests.conftest import tiny_model
from tests.reliability.conftest import LORA_RECIPE, fit_args, run_wide, save_tiny_model


def expect_error(argv, capsys, *needles: str) -> str:
    rc, err = run_wide(argv, capsys)
    lines = [line for line in err.splitlines() if line.startswith("wide fit: error: ")]
    assert rc == 1 and len(lines) == 1, f"expected one error line, got rc={rc}:\n{err[-2000:]}"
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        pytest.param(["--model.init_args.routing.ffn_group_size", "48"],
                     ["ffn_group_size: 48 does not divide the FFN width 128"], id="ffn-group-does-not-divide"),
        pytest.param(["--model.init_args.routing.attn_group_size", "3"],
                     ["attn_group_size: 3 does not divide the 8 query heads"], id="attn-group-does-not-divide"),
        pytest.param(["--model.init_args.routing.sparsity", "1.0"],
                     ["sparsity: target skip rate must be a number in [0, 1), got 1.0"], id="sparsity-one"),
        pytest.param(["--model.init_args.routing.ffn_sparsity", "-0.1"],
                     ["ffn_sparsity: target skip rate must be a number in [0, 1), got -0.1"], id="sparsity-negative"),
        pytest.param(["--model.init_args.routing.router", "lowrnak"],
                     ["router: unknown router 'lowrnak'", "Did you mean 'lowrank'", "Registered: "], id="router-typo"),
        pytest.param(["--model.init_args.routing.granularity", "widht"],
                     ["granularity: unknown policy 'widht'", "Did you mean 'width'"], id="policy-typo"),
        pytest.param(["--model.init_args.routing.dense_layers", "[5]"],
                     ["dense_layers: index 5 is out of range for 2 layers"], id="dense-layer-out-of-range"),
        pytest.param(["--data.seq_len", "512", "--data.max_val_tokens", "1024"],
                     ["data.seq_len: 512 exceeds the maximum sequence length", "max_position_embeddings=256"],
                     id="seq-len-above-model-limit"),
        pytest.param(["--model.init_args.model", "/no/such/model"],
                     ["model: cannot read the config of '/no/such/model'"], id="model-not-found"),
        pytest.param(["--trainer.strategy", '{"class_path": "lightning.pytorch.strategies.ModelParallelStrategy"}',
                      "--trainer.devices", "2"],
                     ["trainer.strategy: ModelParallelStrategy defaults to tensor parallelism",
                      "wide.distributed.FSDP2Strategy"], id="tensor-parallel-strategy"),
    ],
)
def test_bad_routing_model_or_run_config(extra, needles, tmp_path, tiny_model_dir, tiny_corpus, capsys,
                                         no_weights_loaded, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    expect_error(fit_args(tmp_path, tiny_model_dir, tiny_corpus, *extra), capsys, *needles)
    assert not (tmp_path / "wide").exists(), "nothing is written for a run that never starts"


def test_gqa_misaligned_groups(tmp_path, tiny_model_dir, tiny_corpus, capsys, no_weights_loaded):
    # 12 query heads over 4 KV heads: groups of 2 would split the 3 query heads of one KV head
    gqa3 = save_tiny_model(tmp_path / "gqa3", tiny_model_dir, hidden_size=96, num_attention_heads=12,
                           num_key_value_heads=4)
    expect_error(fit_args(tmp_path / "run", gqa3, tiny_corpus), capsys,
                 "attn_group_size: 2 is not GQA-aligned: with 3 query heads per KV head")
    with pytest.raises(ValueError, match="^attn_group_size: 2 is not GQA-aligned"):  # the library entry point
        wide.apply_wide(tiny_model("llama", hidden_size=96, num_attention_heads=12, num_key_value_heads=4),
                        wide.WideConfig(attn_group_size=2, ffn_group_size=32))


def test_unknown_architecture_lists_supported(tmp_path, tiny_model_dir, tiny_corpus, capsys, no_weights_loaded):
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(vocab_size=96, n_embd=32, n_layer=1, n_head=2, n_positions=64)).save_pretrained(gpt2)
    expect_error(fit_args(tmp_path / "run", str(gpt2), tiny_corpus), capsys,
                 "model: architecture 'gpt2' is not supported; supported: gemma3_text, llama, mistral, qwen2, qwen3")


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        pytest.param("\n\n", ["no non-empty documents"], id="empty"),
        pytest.param("the cat sat\n\na dog ran\n\nthe sun\n", ["the training split", "too short for one pack row"],
                     id="too-short"),
    ],
)
def test_empty_or_too_short_dataset(text, needles, tmp_path, tiny_model_dir, capsys, no_weights_loaded):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(text)
    expect_error(fit_args(tmp_path, tiny_model_dir, str(corpus)), capsys, *needles)


def test_assets_missing_while_offline(tmp_path, tiny_corpus, capsys, monkeypatch, no_weights_loaded):
    import wide.assets.download as D

    monkeypatch.setenv("WIDE_CACHE", str(tmp_path / "empty-cache"))

    def offline(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: network unreachable")

    monkeypatch.setattr(D.subprocess, "run", offline)
    expect_error(fit_args(tmp_path, "smollm2-135m", tiny_corpus), capsys,
                 "'smollm2-135m'", "network unreachable", "wide assets fetch")


def test_router_checkpoint_of_another_model(tmp_path, tiny_model_dir, tiny_corpus, capsys):
    from wide.io.checkpoint import save_trained

    cfg = wide.WideConfig(attn_group_size=2, ffn_group_size=32)
    other = wide.apply_wide(tiny_model("llama", num_hidden_layers=3), cfg)  # one layer more
    ckpt = save_trained(other, tmp_path / "other.safetensors", config=cfg, stage="calibrate")
    lora = ["--model.init_args.router_checkpoint", str(ckpt), "--model.init_args.gradient_checkpointing", "false"]
    expect_error(fit_args(tmp_path / "a", tiny_model_dir, tiny_corpus, *lora, recipe=LORA_RECIPE), capsys,
                 "router_checkpoint: made for another model", "num_hidden_layers: checkpoint 3 vs model 2")
    # same shapes, other weights: caught by the embedding fingerprint once the backbone is loaded
    twin = wide.apply_wide(tiny_model("llama", num_hidden_layers=2, seed=5), cfg)
    ckpt = save_trained(twin, tmp_path / "twin.safetensors", config=cfg, stage="calibrate")
    lora[1] = str(ckpt)
    expect_error(fit_args(tmp_path / "b", tiny_model_dir, tiny_corpus, *lora, recipe=LORA_RECIPE), capsys,
                 "checkpoint: made for another model", "embedding_fingerprint")
    (tmp_path / "junk.safetensors").write_bytes(b"\0" * 64)
    lora[1] = str(tmp_path / "junk.safetensors")
    expect_error(fit_args(tmp_path / "c", tiny_model_dir, tiny_corpus, *lora, recipe=LORA_RECIPE), capsys,
                 "junk.safetensors is not a safetensors file")


def test_stage2_routing_that_contradicts_the_checkpoint(tmp_path, tiny_model_dir):
    from wide.io.checkpoint import save_trained
    from wide.tasks import LoRARecovery

    cfg = wide.WideConfig(attn_group_size=2, ffn_group_size=32)
    ckpt = save_trained(wide.apply_wide(tiny_model("llama", num_hidden_layers=2), cfg), tmp_path / "r.safetensors",
                        config=cfg, stage="calibrate")
    with pytest.raises(ValueError, match="^routing: differs from the router checkpoint"):
        LoRARecovery(model=tiny_model_dir, router_checkpoint=str(ckpt), routing=wide.WideConfig(ffn_group_size=64))


def test_resume_last_needs_a_fixed_folder(tmp_path, tiny_model_dir, tiny_corpus, capsys, no_weights_loaded):
    argv = fit_args(tmp_path, tiny_model_dir, tiny_corpus, "--ckpt_path", "last")
    argv[argv.index("--wide_checkpoint.dirpath") + 1] = "null"
    expect_error(argv, capsys, "ckpt_path: 'last' needs a fixed --wide_checkpoint.dirpath")


def test_unsupported_strategies_are_named():
    from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy

    from wide.distributed import FSDP2Strategy, check_strategy

    with pytest.raises(ValueError, match="FSDPStrategy \\(FSDP1\\) is not supported; use .*FSDP2Strategy"):
        check_strategy(FSDPStrategy())
    with pytest.raises(ValueError, match="tensor_parallel_size=2 is not supported"):
        check_strategy(ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=2))
    check_strategy(FSDP2Strategy())
    check_strategy(ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1))


def test_traceback_on_request(tmp_path, tiny_model_dir, tiny_corpus, monkeypatch):
    from wide.cli import main

    monkeypatch.setenv("WIDE_TRACEBACK", "1")
    with pytest.raises(ValueError, match="^ffn_group_size: 48 does not divide"):
        main(fit_args(tmp_path, tiny_model_dir, tiny_corpus, "--model.init_args.routing.ffn_group_size", "48"))
    assert torch.is_grad_enabled()
