"""Shared pieces of the fault and bad-input suite: tiny runs of ``wide fit``, in-process or as a subprocess."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes/smollm2-135m/calibrate.yaml"
LORA_RECIPE = ROOT / "recipes/smollm2-135m/lora.yaml"


def fit_args(out: Path, model_dir: str, corpus: str, *extra: str, recipe: Path = RECIPE) -> list[str]:
    """``wide fit`` arguments for a seconds-long CPU run of the tiny model writing into ``out``."""
    routing = []
    if "RouterCalibration" in recipe.read_text():
        routing = ["--model.init_args.routing.attn_group_size", "2", "--model.init_args.routing.ffn_group_size", "32"]
    return [
        "fit", "--config", str(recipe),
        "--model.init_args.model", model_dir, *routing,
        "--data.source", corpus, "--data.seq_len", "32", "--data.batch_size", "2", "--data.max_val_tokens", "256",
        "--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.precision", "32-true",
        "--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
        "--trainer.enable_model_summary", "false",
        "--trainer.default_root_dir", str(out), "--wide_checkpoint.dirpath", str(out / "wide"),
        *extra,
    ]  # fmt: skip


def run_wide(argv: list[str], capsys) -> tuple[int, str]:
    """``wide <argv>`` in-process, as the console script runs it: (exit status, stderr)."""
    from wide.cli import main

    capsys.readouterr()
    try:
        rc = main(argv)
    except SystemExit as exit_:  # jsonargparse reports parse errors this way
        rc = exit_.code
    return rc, capsys.readouterr().err


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_wide_subprocess(argv: list[str]) -> subprocess.Popen:
    """Starts ``python -m wide.cli <argv>`` in a fresh process (for hard kills and multi-process runs).

    Each gets its own rendezvous port, so multi-process runs can run side by side.
    """
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_free_port())}
    env.pop("WIDE_TRACEBACK", None)
    return subprocess.Popen([sys.executable, "-m", "wide.cli", *argv], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout: float = 180) -> subprocess.CompletedProcess:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_wide_subprocess(argv: list[str], timeout: float = 180) -> subprocess.CompletedProcess:
    """``python -m wide.cli <argv>`` in a fresh process, waited for."""
    return finish(start_wide_subprocess(argv), timeout)


def save_tiny_model(path: Path, tokenizer_dir: str, arch: str = "llama", **overrides) -> str:
    """A saved tiny random model of ``arch`` with the tokenizer of ``tokenizer_dir``."""
    from tests.conftest import tiny_model

    path.mkdir(parents=True, exist_ok=True)
    for f in Path(tokenizer_dir).iterdir():
        if "token" in f.name:
            shutil.copy(f, path / f.name)
    overrides.setdefault("num_hidden_layers", 2)
    tiny_model(arch, **overrides).save_pretrained(path)
    return str(path)


@pytest.fixture
def no_weights_loaded(monkeypatch):
    """Fails the test if any model weights get loaded: bad input must be caught from config.json alone."""
    from transformers import AutoModelForCausalLM

    def forbidden(*args, **kwargs):
        raise AssertionError("model weights were loaded before the bad input was rejected")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", forbidden)
