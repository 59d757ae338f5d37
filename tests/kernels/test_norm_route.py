"""`rms_norm_route`: a layer's HF RMSNorm and its router's decisions in one launch (the router kernel's
``WRITE_NORM``), against the reference (HF's formula and `router_margin`)."""

import pytest
import torch

import wide.kernels as wk
from .cases import GridSpy
from wide.kernels.backends.torch_ref import hf_rms_norm

DEV = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(not wk.get_backend("triton").is_available(), reason="triton unavailable")


def _router(gen, d, rank, groups, up=True, bias=True):
    down = (torch.randn(rank if up else groups, d, generator=gen) * d ** -0.5).to(DEV)
    u = (torch.randn(groups, rank, generator=gen) * 0.35).to(DEV) if up else None
    b = (torch.randn(groups, generator=gen) * 0.1).to(DEV) if bias else None
    return down, u, b


def _run(monkeypatch, x, w, r, norm_eps=1e-5):
    from wide.kernels.triton import router as host

    spy = GridSpy(host._router_margin_kernel)  # grids (rows, SPLIT)
    monkeypatch.setattr(host, "_router_margin_kernel", spy)
    y, d = wk.rms_norm_route(x, w, norm_eps, *r, backend="triton")
    assert len(spy.grids) == 1, "one launch for the norm and the router"
    return y, d, spy.grids[0][1]


def _check(y, d, x, w, r, norm_eps=1e-5):
    y0 = hf_rms_norm(x, w, norm_eps)
    m = wk.router_margin(x.float(), *r, decide=False, backend="torch")
    assert y.dtype == x.dtype and y.shape == x.shape and d.dtype == torch.bool and d.shape == m.shape
    rtol = 1e-5 if x.dtype == torch.float32 else 2 * torch.finfo(x.dtype).eps
    torch.testing.assert_close(y.float(), y0.float(), rtol=rtol, atol=1e-6)
    clear = m.abs() >= 1e-3
    assert torch.equal(d[clear], (m >= 0)[clear])


@pytest.mark.parametrize("d, rank, split", [(200, 8, 1), (72, 8, 1), (1000, 8, 4), (200, 64, 4), (2100, 8, 16)])
@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_matches_reference_with_and_without_split(d, rank, split, rows, dtype, monkeypatch):
    gen = torch.Generator().manual_seed(d + rank + rows)
    x = (torch.randn(rows, 1, d, generator=gen) * 2).to(DEV, dtype)
    w = (1 + 0.3 * torch.randn(d, generator=gen)).to(DEV, dtype)
    r = _router(gen, d, rank, 7)
    y, dec, got_split = _run(monkeypatch, x, w, r)
    assert got_split == split
    _check(y, dec, x, w, r)
    y2, dec2, _ = _run(monkeypatch, x, w, r)  # the split path reset its arrival counters: the same again
    assert torch.equal(y, y2) and torch.equal(dec, dec2)


@pytest.mark.parametrize("up, bias", [(True, True), (True, False), (False, True), (False, False)])
def test_zero_and_huge_rows(up, bias, monkeypatch):
    gen = torch.Generator().manual_seed(3)
    d = 1000  # split over programs
    for dtype, huge in ((torch.float16, 1e4), (torch.float32, 1e15)):
        x = torch.randn(3, d, generator=gen)
        x[0] = 0.0
        x[2] *= huge
        x = x.to(DEV, dtype)
        w = (1 + 0.3 * torch.randn(d, generator=gen)).to(DEV, dtype)
        r = _router(gen, d, 8, 9, up, bias)
        y, dec, _ = _run(monkeypatch, x, w, r)
        assert torch.isfinite(y).all()
        assert torch.equal(y[0], torch.zeros_like(y[0]))
        m0 = r[2] if bias else torch.zeros(9, device=DEV)  # a zero row's margin is the bias alone
        assert torch.equal(dec[0], m0 >= 0)
        _check(y, dec, x, w, r)


def test_groups_not_a_multiple_of_the_block(monkeypatch):
    gen = torch.Generator().manual_seed(5)
    d = 96
    x = torch.randn(4, d, generator=gen).to(DEV)
    w = (1 + 0.3 * torch.randn(d, generator=gen)).to(DEV)
    r = _router(gen, d, 128, 100)  # rank 128: blocks of 32 groups, the last one partial
    y, dec, _ = _run(monkeypatch, x, w, r)
    _check(y, dec, x, w, r)
    r = _router(gen, d, 8, 37, up=False)  # a linear router of 37 groups
    y, dec, _ = _run(monkeypatch, x, w, r)
    _check(y, dec, x, w, r)


def test_router_eps_and_norm_eps_are_separate(monkeypatch):
    gen = torch.Generator().manual_seed(7)
    x = (torch.randn(2, 64, generator=gen) * 1e-3).to(DEV)  # small rows: the epsilons matter
    w = torch.ones(64, device=DEV)
    r = _router(gen, 64, 8, 5)
    y, _, _ = _run(monkeypatch, x, w, r, norm_eps=1e-2)
    torch.testing.assert_close(y, hf_rms_norm(x, w, 1e-2), rtol=1e-5, atol=1e-7)
    y6, dec, _ = _run(monkeypatch, x, w, r, norm_eps=1e-6)
    assert not torch.allclose(y, y6)
    assert torch.equal(dec, wk.router_margin(x, *r, backend="torch"))  # the router's own eps (1e-6) throughout


def test_prefill_rows_take_the_torch_norm_and_router_margin():
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(2, 40, 48, generator=gen).to(DEV)
    w = (1 + 0.3 * torch.randn(48, generator=gen)).to(DEV)
    r = _router(gen, 48, 8, 5)
    y, dec = wk.rms_norm_route(x, w, 1e-5, *r, backend="triton")
    assert torch.equal(y, hf_rms_norm(x, w, 1e-5))
    assert torch.equal(dec, wk.router_margin(x, *r, backend="triton"))


def test_bad_shapes_and_coherent_are_rejected():
    from wide.kernels.triton import router as host

    x = torch.randn(2, 48, device=DEV)
    r = _router(torch.Generator().manual_seed(0), 48, 8, 5)
    with pytest.raises(ValueError, match="norm_weight"):
        wk.rms_norm_route(x, torch.ones(47, device=DEV), 1e-5, *r)
    out = torch.empty(2, 5, device=DEV)
    with pytest.raises(ValueError, match="coherent"):
        host._margin_launch(x, *r, True, 1e-6, out, False, coherent={},
                            norm=(torch.ones(48), torch.empty_like(x), 1e-5))


def test_hf_formula_is_llama_rmsnorm():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(48, eps=1e-5).to(torch.float16)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(48))
    x = (torch.randn(3, 48) * 4).to(torch.float16)
    assert torch.equal(hf_rms_norm(x, norm.weight, 1e-5), norm(x))
