"""``precision: auto``: bf16 where the hardware computes it natively, fp32 elsewhere; chosen before the Trainer."""

import logging

import pytest
import torch

import wide.trainer as wt


@pytest.fixture
def cpu(monkeypatch):
    """Sets the CPU flags and the ISA torch dispatches to."""

    def set_cpu(flags: str, capability: str):
        monkeypatch.setattr(wt, "_cpu_flags", lambda: set(flags.split()))
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)

    return set_cpu


@pytest.mark.parametrize("flags, capability, expected", [
    pytest.param("avx2 avx512f avx512_bf16", "AVX512", "bf16-mixed", id="avx512-bf16"),
    pytest.param("avx2 avx512f amx_bf16 amx_tile", "AVX512", "bf16-mixed", id="amx"),
    pytest.param("avx2 avx512f avx512_bf16", "AVX2", "32-true", id="bf16-silicon-but-torch-capped-to-avx2"),
    pytest.param("avx2 avx512f avx512bw", "AVX512", "32-true", id="avx512-without-bf16"),
    pytest.param("avx2 fma", "AVX2", "32-true", id="avx2-only"),
    pytest.param("", "DEFAULT", "32-true", id="no-flags"),
])
def test_cpu_precision_follows_native_bf16(cpu, flags, capability, expected):
    cpu(flags, capability)
    precision, why = wt.auto_precision("cpu")
    assert precision == expected
    assert f"torch CPU capability {capability}" in why


@pytest.mark.parametrize("capability, expected", [((9, 0), "bf16-mixed"), ((8, 0), "bf16-mixed"),
                                                  ((7, 5), "32-true")], ids=["sm90", "sm80", "sm75"])
def test_cuda_precision_follows_compute_capability(monkeypatch, capability, expected):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Test GPU")
    precision, why = wt.auto_precision("gpu")
    assert precision == expected and f"compute capability {capability[0]}.{capability[1]}" in why
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert wt.auto_precision("auto")[0] == expected, "accelerator auto picks the GPU when there is one"


def test_auto_true_keeps_bf16_true(cpu):
    cpu("avx512_bf16", "AVX512")
    assert wt.auto_precision("cpu", "bf16-true")[0] == "bf16-true"


def test_trainer_resolves_auto_and_says_why(cpu, caplog):
    cpu("avx2", "AVX2")
    with caplog.at_level(logging.INFO):
        trainer = wt.WideTrainer(precision="auto", accelerator="cpu", logger=False, enable_checkpointing=False,
                                 enable_progress_bar=False, enable_model_summary=False)
    assert trainer.precision == "32-true"
    assert any("wide: precision auto -> 32-true: no avx512_bf16/amx_bf16 CPU flag" in r.getMessage()
               for r in caplog.records)
    cpu("avx512_bf16", "AVX512")
    trainer = wt.WideTrainer(precision="auto", accelerator="cpu", logger=False, enable_checkpointing=False)
    assert trainer.precision == "bf16-mixed"
    assert wt.WideTrainer(precision="bf16-true", accelerator="cpu", logger=False).precision == "bf16-true"


def test_the_cli_takes_precision_auto(cpu, tiny_model_dir, tiny_corpus, tmp_path):
    from wide.cli import run_cli

    cpu("avx2", "AVX2")
    cli = run_cli(["--model", "wide.tasks.RouterCalibration", "--model.init_args.model", tiny_model_dir,
                   "--data.source", tiny_corpus, "--trainer.accelerator", "cpu", "--trainer.precision", "auto",
                   "--trainer.logger", "false", "--trainer.default_root_dir", str(tmp_path)], run=False)
    assert cli.trainer.precision == "32-true"
