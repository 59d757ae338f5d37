import logging
import subprocess
import sys

import pytest
import torch

import wide.kernels as wk
from wide.kernels import dispatch
from wide.kernels.backends import KernelBackend, get_backend, list_backends, register_backend

from .cases import INTERPRET


def _gemm_args(M=5, K=32, N=32, ng=2, dtype=torch.float32):
    x = torch.randn(M, K, dtype=dtype)
    w = torch.randn(N, K, dtype=dtype)
    mask = torch.rand(M, ng) < 0.5
    return x, w, mask


def test_registry_contents_and_errors():
    assert {"torch", "gather", "triton"} <= set(list_backends())
    with pytest.raises(ValueError, match="Did you mean 'triton'"):
        get_backend("trito")

    class Dup(KernelBackend):
        name = "torch"

    with pytest.raises(ValueError, match="already registered"):
        register_backend(Dup)
    with pytest.raises(TypeError):
        register_backend(int)


def test_auto_on_cpu_is_torch_and_forcing(monkeypatch):
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)
    x, w, mask = _gemm_args()
    call = dict(x=x, weight=w, mask=mask)
    assert dispatch.choose("gemm_mn", "auto", call, x.device).name == "torch"
    assert dispatch.choose("gemm_mn", "gather", call, x.device).name == "gather"
    monkeypatch.setenv(dispatch.ENV_VAR, "gather")
    assert dispatch.choose("gemm_mn", "auto", call, x.device).name == "gather"
    # an explicit argument wins over the environment
    assert dispatch.choose("gemm_mn", "torch", call, x.device).name == "torch"


def test_rejected_call_falls_back_and_logs_once(caplog, monkeypatch):
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)
    dispatch.reset_log_cache()
    x, w, mask = _gemm_args()
    fmask = mask.float().requires_grad_()
    with caplog.at_level(logging.INFO, logger="wide.kernels"):
        for _ in range(3):
            y = wk.gemm_mn(x, w, fmask, backend="gather")
    msgs = [r.getMessage() for r in caplog.records if "gather rejected" in r.getMessage()]
    assert len(msgs) == 1 and "float" in msgs[0]
    assert caplog.records[0].levelno == logging.WARNING  # forced backend rejected: a warning
    y.sum().backward()
    assert fmask.grad is not None and fmask.grad.abs().sum() > 0


@pytest.mark.parametrize("why,kwargs", [
    ("autograd", dict(grad=True)),
    ("multiple of 16", dict(N=24, ng=3)),
    ("dtype", dict(dtype=torch.float64)),
])
def test_triton_verifier_reasons(why, kwargs):
    grad = kwargs.pop("grad", False)
    x, w, mask = _gemm_args(**kwargs)
    w.requires_grad_(grad)
    ok, reason = get_backend("triton").verify("gemm_mn", x=x, weight=w, mask=mask)
    assert not ok and why in reason


@pytest.mark.skipif(not INTERPRET, reason="CPU tensors reach the triton backend only in the interpreter")
def test_forced_triton_runs_on_cpu_under_interpreter():
    x, w, mask = _gemm_args(dtype=torch.float16)
    ref = wk.gemm_mn(x.float(), w.float(), mask, backend="torch")
    out = wk.gemm_mn(x, w, mask, backend="triton")
    assert torch.allclose(out.float(), ref, atol=5e-2, rtol=1e-2)


def test_interpreter_is_active():
    if not INTERPRET:
        pytest.skip("GPU run")
    from triton.runtime.interpreter import InterpretedFunction

    import triton.language as tl
    from wide.kernels.triton import gemm_k_kernels

    assert isinstance(gemm_k_kernels._gemm_k_kernel, InterpretedFunction)
    assert isinstance(tl.sum, InterpretedFunction)


def test_import_without_triton():
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import wide.kernels as wk, torch\n"
        "assert 'triton' not in wk.available_backends()\n"
        "x = torch.randn(3, 32); w = torch.randn(32, 32); m = torch.ones(3, 2, dtype=torch.bool)\n"
        "assert torch.allclose(wk.gemm_mn(x, w, m), x @ w.T, atol=1e-5)\n"
        "assert [m for m in sys.modules if m.startswith('wide.kernels.triton.')] == ['wide.kernels.triton.common']\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


class _FakeCuda:
    """Stands for a CUDA tensor in the device check (no CUDA here): only what the fast path reads."""

    is_cuda = True

    def __init__(self, index):
        self.index = index
        self.device = torch.device("cuda", index)

    def get_device(self):
        return self.index


def test_device_check_fast_path_agrees_with_the_general_one():
    from wide.kernels.backends.triton_backend import _device_ok

    assert _device_ok(_FakeCuda(0), None, _FakeCuda(0)) == (True, "")
    ok, why = _device_ok(_FakeCuda(0), _FakeCuda(1))
    assert not ok and "several devices" in why
    ok, why = _device_ok(_FakeCuda(0), torch.zeros(1))
    assert not ok and "several devices" in why
    ok, why = _device_ok(torch.zeros(1, device="meta"))
    assert not ok and "meta" in why


def test_triton_availability_follows_the_interpreter_switch(monkeypatch):
    from wide.kernels.backends.triton_backend import TritonBackend

    monkeypatch.setattr(TritonBackend, "_found", False)  # as on a machine without CUDA
    monkeypatch.setattr(TritonBackend, "_importable", True)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert TritonBackend.is_available()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert not TritonBackend.is_available()
