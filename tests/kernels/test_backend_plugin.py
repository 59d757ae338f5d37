"""A kernel backend is one class and one registration: once registered, `WideConfig(backend=...)` takes it,
``wide bench --backend`` lists it, ``auto`` picks it where its ``auto_devices`` say, and a call its verifier
declines runs on the ``torch`` reference with the reason logged. Registered here for the test only."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

import wide.kernels as wk
from wide.config import WideConfig
from wide.kernels import dispatch
from wide.kernels.backends import KernelBackend, auto_order, register_backend, unregister_backend


class ThrowAway(KernelBackend):
    """Dense gemm_mn on CPU tensors, bias-free calls only."""

    name = "throwaway"
    auto_devices = ("cpu",)
    priority = 100
    calls = 0

    def verify_gemm_mn(self, x, weight, mask, bias=None, **_):
        if bias is not None:
            return False, "no bias here"
        return True, ""

    def gemm_mn(self, x, weight, mask, *, bias=None, activation=None, plan=None, out=None):
        type(self).calls += 1
        y = F.linear(x, weight) * mask.repeat_interleave(weight.shape[0] // mask.shape[-1], -1)
        return y if out is None else out.copy_(y)


class Absent(KernelBackend):
    name = "absent"

    @classmethod
    def is_available(cls) -> bool:
        return False

    def gemm_mn(self, *a, **k):
        raise AssertionError("an unavailable backend ran")


@pytest.fixture
def plugins(monkeypatch):
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)
    dispatch.reset_log_cache()
    ThrowAway.calls = 0
    register_backend(ThrowAway)
    register_backend(Absent)
    try:
        yield
    finally:
        unregister_backend("throwaway")
        unregister_backend("absent")
        dispatch.reset_log_cache()


def test_a_registered_backend_is_configured_listed_and_picked(plugins, caplog):
    from wide.bench.cli import parser

    assert WideConfig(backend="throwaway").backend == "throwaway"
    with pytest.raises(ValueError, match="backend: unknown kernel backend 'throwawya'.*Did you mean 'throwaway'"):
        WideConfig(backend="throwawya")
    assert {"throwaway", "absent"} <= set(wk.backend_choices()) and "absent" not in wk.available_backends()
    assert parser().parse_args(["--backend", "throwaway"]).backend == "throwaway"
    assert [b.name for b in auto_order("cpu")] == ["throwaway"] and auto_order("cuda")[0].name == "triton"

    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(5, 32, generator=g), torch.randn(32, 32, generator=g), torch.randn(32, generator=g)
    mask = torch.rand(5, 2, generator=g) < 0.5
    ref = wk.gemm_mn(x, w, mask, backend="torch")
    with caplog.at_level(logging.INFO, logger="wide.kernels"):
        torch.testing.assert_close(wk.gemm_mn(x, w, mask), ref)  # auto on CPU: the plug-in
        assert ThrowAway.calls == 1
        torch.testing.assert_close(wk.gemm_mn(x, w, mask, bias=b), wk.gemm_mn(x, w, mask, bias=b, backend="torch"))
        assert ThrowAway.calls == 1  # declined: the reference ran
        torch.testing.assert_close(wk.gemm_k(x, w, mask), wk.gemm_k(x, w, mask, backend="torch"))
        torch.testing.assert_close(wk.gemm_mn(x, w, mask, backend="absent"), ref)
    logs = [r.getMessage() for r in caplog.records]
    assert "wide.kernels.gemm_mn -> throwaway (auto)" in logs
    assert "wide.kernels.gemm_mn -> torch (throwaway rejected: no bias here)" in logs
    assert any("gemm_k -> torch (throwaway rejected: backend 'throwaway' does not implement gemm_k)" in m for m in logs)
    assert any("absent rejected: absent backend unavailable here" in m for m in logs)


def test_an_unregistered_backend_is_gone_everywhere(plugins):
    unregister_backend("throwaway")
    register_backend(ThrowAway)  # the fixture removes it again
    unregister_backend("throwaway")
    try:
        assert "throwaway" not in wk.list_backends() and not auto_order("cpu")
        with pytest.raises(ValueError, match="unknown kernel backend 'throwaway'"):
            WideConfig(backend="throwaway")
        with pytest.raises(ValueError, match="backend: unknown kernel backend 'throwaway'"):
            wk.gemm_mn(torch.randn(2, 16), torch.randn(16, 16), torch.ones(2, 1, dtype=torch.bool), backend="throwaway")
    finally:
        register_backend(ThrowAway)


def test_auto_is_no_backend_name_and_the_reference_stays():
    class Auto(KernelBackend):
        name = "auto"

    with pytest.raises(ValueError, match="`name`"):
        register_backend(Auto)
    with pytest.raises(ValueError, match="reference"):
        unregister_backend("torch")
