"""Throughput reporting: the FLOP formula against torch's FLOP counter, the peak table, and what `wide fit` logs."""

from __future__ import annotations

import csv

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import wide
from tests.conftest import tiny_model
from tests.reliability.conftest import fit_args, run_wide
from wide.callbacks.throughput import peak_tflops, train_flops_per_token
from wide.io import ADAPTERS, is_adapter_name
from wide.losses import LossConfig, objective


@pytest.mark.parametrize("cfg", [pytest.param(LossConfig(), id="lm"),
                                 pytest.param(LossConfig(lm=0.5, kd=1.0), id="lm+kd")])
def test_flop_formula_matches_counted_flops_of_a_training_step(cfg):
    """torch's FlopCounterMode over one stage-1 step (eager attention, which computes the full T x T scores where
    the formula counts the causal half): the formula is an upper bound within 10% (the first layer needs no input
    gradients)."""
    model = tiny_model("llama", num_hidden_layers=8, vocab_size=512)
    model.config._attn_implementation = "eager"
    wide.apply_wide(model, wide.WideConfig(attn_group_size=2, ffn_group_size=32)).train()
    b, t = 2, 64
    with FlopCounterMode(display=False) as counter:
        objective(model, {"input_ids": torch.randint(3, 512, (b, t))}, cfg).total.backward()
    c = model.config
    causal_attention = 2 * c.num_hidden_layers * t * c.num_attention_heads * c.head_dim
    passes = 3 + (1 if cfg.uses_teacher else 0)  # student forward + backward (2x), teacher forward
    counted = counter.get_total_flops() / (b * t) - passes * causal_attention  # full scores -> causal half
    formula = train_flops_per_token(model, t, teacher=cfg.uses_teacher, teacher_head=cfg.kd > 0)
    assert 0.9 < counted / formula <= 1.0, (counted, formula)


def test_peak_table_knows_hopper_and_ampere_and_omits_the_rest(monkeypatch):
    cuda = torch.device("cuda", 0)
    for name, peak in [("NVIDIA H200", 989.0), ("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 PCIe", 756.0),
                       ("NVIDIA A100-SXM4-80GB", 312.0), ("Tesla T4", None)]:
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None, name=name: name)
        assert peak_tflops(cuda, torch.bfloat16) == peak, name
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    assert peak_tflops(cuda, torch.float32) is None  # fp32 / tf32 peaks are not tabled
    assert peak_tflops(torch.device("cpu"), torch.bfloat16) is None


def _metrics(out) -> dict[str, list[float]]:
    rows = list(csv.DictReader(open(next(out.glob("lightning_logs/version_*/metrics.csv")))))
    table: dict[str, list[float]] = {}
    for row in rows:
        for key, value in row.items():
            if value and key.startswith("perf/"):
                table.setdefault(key, []).append(float(value))
    return table


def _fit(out, model_dir, corpus, capsys, *extra):
    csv_logger = f'{{"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {{"save_dir": "{out}"}}}}'
    argv = fit_args(out, model_dir, corpus, "--trainer.max_steps", "6", "--trainer.limit_val_batches", "0",
                    "--trainer.logger", csv_logger, "--trainer.log_every_n_steps", "1", "--throughput.window", "2",
                    *extra)
    rc, err = run_wide(argv, capsys)
    assert rc == 0, err[-3000:]
    return _metrics(out)


def test_fit_logs_tokens_per_second_and_omits_mfu_on_an_unknown_device(tmp_path, tiny_model_dir, tiny_corpus,
                                                                        capsys):
    logs = _fit(tmp_path, tiny_model_dir, tiny_corpus, capsys)
    assert len(logs["perf/tokens_per_s"]) >= 3 and all(v > 0 for v in logs["perf/tokens_per_s"])
    assert "perf/mfu" not in logs and all(v > 0 for v in logs["perf/tflops"])


def test_fit_computes_mfu_against_the_given_peak(tmp_path, tiny_model_dir, tiny_corpus, capsys):
    logs = _fit(tmp_path, tiny_model_dir, tiny_corpus, capsys, "--throughput.peak_tflops", "0.25")
    assert len(logs["perf/mfu"]) == len(logs["perf/tflops"]) >= 3
    for mfu, tflops in zip(logs["perf/mfu"], logs["perf/tflops"]):
        assert mfu == pytest.approx(tflops / 0.25, rel=1e-5)


@pytest.mark.parametrize("name", ADAPTERS.names())
def test_flop_formula_counts_every_stage2_adapter(name):
    """Stage 2: LoRA's weights train with their own gradients (6 per element), a sparse (SHiRA) adapter's values
    come from the dense gradient of the weight it adapts (2 more per element of that weight)."""
    from tests.io.adapter_cases import adapted

    model = tiny_model("llama", num_hidden_layers=8, vocab_size=512)
    model.config._attn_implementation = "eager"
    model, _ = adapted(model, name)
    for n, p in model.named_parameters():
        p.requires_grad_(is_adapter_name(n) or ".wide.routers." in f".{n}")
    model.train()
    b, t = 2, 64
    with FlopCounterMode(display=False) as counter:
        objective(model, {"input_ids": torch.randint(3, 512, (b, t))}, LossConfig()).total.backward()
    c = model.config
    counted = counter.get_total_flops() / (b * t) - 3 * 2 * c.num_hidden_layers * t * c.num_attention_heads * c.head_dim
    assert 0.9 < counted / train_flops_per_token(model, t) <= 1.0
