"""The GPU sweep scripts under ``benchmarks/`` build their candidate configs on any machine: a config field the
kernels no longer take fails here, on CPU CI, not after device minutes are spent."""

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[1] / "benchmarks"


def _file_module(name: str, alias: str):
    spec = importlib.util.spec_from_file_location(alias, ROOT / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _load(name: str, monkeypatch):
    # the sweeps import benchmarks/kernels.py as ``kernels``, which the tests' own ``kernels`` package shadows
    monkeypatch.setitem(sys.modules, "kernels", _file_module("kernels", "kernels"))
    return _file_module(name, f"sweep_{name}")


@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("op", ["gemm_mn", "swiglu"])
def test_prefill_gemm_sweep_candidates(op, wide, monkeypatch):
    from wide.kernels.triton.common import GemmConfig

    cands = _load("prefill_gemm_sweep", monkeypatch).candidates(op, wide)
    assert cands[0] is None and len(cands) > 2
    for kind, cfg in cands[1:]:
        assert kind == "perm" and isinstance(cfg, GemmConfig)


def test_gemv_sweep_candidates(monkeypatch):
    mod = _load("gemv_sweep", monkeypatch)
    for table in (mod.CANDIDATES, mod.CANDIDATES_16):
        assert set(table) == {"gemm_k", "gemm_mn", "swiglu"}
        assert all(len(v) > 1 and v[0] is None for v in table.values())


def test_profile_host_timers_count_only_while_on(monkeypatch):
    ph = _load("profile_host", monkeypatch)
    timers = ph.Timers()

    class Owner:
        @staticmethod
        def layer():
            Owner.inner()

        @staticmethod
        def inner():
            return 1

    timers.patch(Owner, "layer", "A layer")
    timers.patch(Owner, "inner", "B inner")
    Owner.layer()  # off: not counted
    timers.on = True
    Owner.layer()
    Owner.layer()
    assert timers.calls == {"A layer": 2, "B inner": 2}
    rows = timers.table("A layer")
    assert len(rows) == 2 and "1.00 calls/layer  B inner" in rows[1]


def test_generator_ttft_measures_both_paths_on_a_tiny_model():
    import torch

    from tests.conftest import tiny_model

    mod = _file_module("generator_ttft", "sweep_generator_ttft")
    model = tiny_model("llama").eval()
    prompts = {t: torch.randint(3, 96, (1, t)) for t in (5, 200)}
    got = mod.measure(model, prompts, new=4, reps=1, max_cache_len=256)
    assert got[5]["plan"] == [128] and got[200]["plan"] == [256]  # default sizes up to the cache length
    assert all(v > 0 for row in got.values() for k, v in row.items() if k != "plan")
