"""`gemm_k_route`: a decode row's closing projection, its residual add, and the next RMSNorm with its router in one
`_gemm_k_kernel` launch (the ``ROUTE`` epilogue), against the reference (`gemm_k` + residual, HF's norm,
`router_margin`), over the kernel's configs (split-K, group lists, tile counts past one partial block)."""

import pytest
import torch

import wide.kernels as wk
from .cases import GridSpy
from wide.kernels.backends.torch_ref import hf_rms_norm
from wide.kernels.triton.common import GemmConfig

DEV = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(not wk.get_backend("triton").is_available(), reason="triton unavailable")


def _inputs(gen, K, groups, N, rank, dtype, density=0.5, up=True, bias=True):
    x = torch.randn(1, 1, K, generator=gen).to(DEV, dtype)
    w = (torch.randn(N, K, generator=gen) * K ** -0.5).to(DEV, dtype)
    mask = (torch.rand(1, 1, groups, generator=gen) < density).to(DEV)
    res = torch.randn(1, 1, N, generator=gen).to(DEV, dtype)
    nw = (1 + 0.3 * torch.randn(N, generator=gen)).to(DEV, dtype)
    down = (torch.randn(rank if up else 7, N, generator=gen) * N ** -0.5).to(DEV)
    u = (torch.randn(7, rank, generator=gen) * 0.35).to(DEV) if up else None
    b = (torch.randn(7, generator=gen) * 0.1).to(DEV) if bias else None
    return x, w, mask, res, nw, (down, u, b)


def _check(out, x, w, mask, res, nw, r):
    h, y, dec = out
    h0 = wk.gemm_k(x.float(), w.float(), mask, residual=res.float(), backend="torch")
    dtype = x.dtype
    tol = 1e-5 if dtype == torch.float32 else 2 * torch.finfo(dtype).eps
    torch.testing.assert_close(h.float(), h0, rtol=tol, atol=tol * h0.abs().max().item())
    # the norm and router of the row as stored (what the unfused `rms_norm_route` after `gemm_k` reads)
    y0 = hf_rms_norm(h, nw, 1e-5)
    torch.testing.assert_close(y.float(), y0.float(), rtol=tol, atol=1e-6)
    m = wk.router_margin(h.float(), *r, decide=False, backend="torch")
    assert dec.dtype == torch.bool and dec.shape == m.shape
    clear = m.abs() >= 1e-3
    assert torch.equal(dec[clear], (m >= 0)[clear])


@pytest.mark.parametrize("cfg", [
    GemmConfig(1, 16, 16), GemmConfig(1, 16, 16, split_k=3), GemmConfig(1, 32, 16, split_k=2, variant="local"),
    GemmConfig(1, 16, 16, split_k=4, variant="list")], ids=["affine", "split3", "local", "list"])
@pytest.mark.parametrize("N, rank", [(40, 8), (600, 100)])  # 600 / 16 = 38 tiles: partials in two blocks at rank 100
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_one_launch_matches_reference(cfg, N, rank, dtype, monkeypatch):
    from wide.kernels.triton import gemm_k as host

    gen = torch.Generator().manual_seed(N + rank + cfg.split_k)
    x, w, mask, res, nw, r = _inputs(gen, 64, 4, N, rank, dtype)
    spy = GridSpy(host._gemm_k_kernel)
    monkeypatch.setattr(host, "_gemm_k_kernel", spy)
    out = host.gemm_k_route(x, w, mask, res, nw, 1e-5, *r, True, 1e-6, config=cfg)
    assert len(spy.grids) == 1, "the projection, the add, the norm and the router in one launch"
    _check(out, x, w, mask, res, nw, r)
    # the counters were reset: a second call (a graph replay's) gives the same bits
    again = host.gemm_k_route(x, w, mask, res, nw, 1e-5, *r, True, 1e-6, config=cfg)
    for a, b in zip(out, again):
        assert torch.equal(a, b)


@pytest.mark.parametrize("up, bias, normalize", [(True, True, True), (False, True, True), (True, False, False)])
@pytest.mark.parametrize("density", [0.0, 1.0, 0.5])
def test_router_forms_and_masks(up, bias, normalize, density):
    gen = torch.Generator().manual_seed(int(density * 10) + up + 2 * bias)
    x, w, mask, res, nw, r = _inputs(gen, 96, 3, 72, 8, torch.float32, density=density, up=up, bias=bias)
    out = wk.gemm_k_route(x, w, mask, res, nw, 1e-5, *r, normalize=normalize, backend="triton")
    h, y, dec = out
    h0 = wk.gemm_k(x, w, mask, residual=res, backend="torch")
    torch.testing.assert_close(h, h0, rtol=1e-5, atol=1e-5)
    m = wk.router_margin(h, *r, normalize=normalize, decide=False, backend="torch")
    clear = m.abs() >= 1e-3
    assert torch.equal(dec[clear], (m >= 0)[clear])
    if density == 0.0:  # nothing runs: the new residual stream is the old one
        assert torch.equal(h, res)


def test_bad_input_names_the_field():
    gen = torch.Generator().manual_seed(0)
    x, w, mask, res, nw, r = _inputs(gen, 64, 4, 40, 8, torch.float32)
    with pytest.raises(ValueError, match="residual"):
        wk.gemm_k_route(x, w, mask, res[..., :39], nw, 1e-5, *r)
    with pytest.raises(ValueError, match="norm_weight"):
        wk.gemm_k_route(x, w, mask, res, nw[:39], 1e-5, *r)
    with pytest.raises(ValueError, match="down"):
        wk.gemm_k_route(x, w, mask, res, nw, 1e-5, r[0][:, :39], *r[1:])


def test_rows_past_one_take_the_reference(caplog):
    gen = torch.Generator().manual_seed(1)
    x, w, mask, res, nw, r = _inputs(gen, 64, 4, 40, 8, torch.float32)
    x3, mask3, res3 = x.expand(3, 1, 64).contiguous(), mask.expand(3, 1, 4).contiguous(), res.expand(3, 1, 40)
    ok, why = wk.get_backend("triton").verify("gemm_k_route", x=x3, weight=w, mask=mask3, residual=res3,
                                              norm_weight=nw, down=r[0], up=r[1], bias=r[2])
    assert not ok and "rows" in why
    h, y, dec = wk.gemm_k_route(x3, w, mask3, res3.contiguous(), nw, 1e-5, *r, backend="triton")
    assert h.shape == (3, 1, 40) and dec.shape == (3, 1, 7)


@pytest.mark.parametrize("cfg", [GemmConfig(1, 16, 16, split_k=3), GemmConfig(1, 32, 16, split_k=2, variant="local"),
                                 GemmConfig(1, 16, 16)], ids=["split3", "local", "no-split"])
@pytest.mark.parametrize("N, rank, up, bias", [(40, 8, True, True), (1500, 100, True, False), (72, 8, False, True)])
def test_warm_tail_gives_the_same_bits(cfg, N, rank, up, bias, monkeypatch):
    """`KernelOptions.route_warm`: the tail's operands loaded early by every program (a store that never runs
    consumes them) and the norm in one trip up to 4096 columns (N = 1500: one instead of two) change no bit of ``h``,
    the norm's output or the decisions; the launch takes the warm constexprs."""
    from wide.kernels import use_kernel_options
    from wide.kernels.triton import gemm_k as host

    gen = torch.Generator().manual_seed(N + rank)
    x, w, mask, res, nw, r = _inputs(gen, 64, 4, N, rank, torch.float16, up=up, bias=bias)
    y_before = torch.zeros(N)
    with use_kernel_options(route_warm=False):
        cold = host.gemm_k_route(x, w, mask, res, nw, 1e-5, *r, True, 1e-6, config=cfg)
    seen = []
    real = host._gemm_k_kernel

    class Spy:
        def __getitem__(self, grid):
            def launch(*a, **k):
                seen.append({n: k[n] for n in ("R_WARM", "BLOCK_D", "BLOCK_W")})
                return real[grid](*a, **k)
            return launch

    monkeypatch.setattr(host, "_gemm_k_kernel", Spy())
    with use_kernel_options(route_warm=True):
        warm = host.gemm_k_route(x, w, mask, res, nw, 1e-5, *r, True, 1e-6, config=cfg)
    assert seen and seen[0]["R_WARM"] and seen[0]["BLOCK_D"] == min(4096, 1 << (N - 1).bit_length())
    for a, b in zip(warm, cold):
        assert torch.equal(a, b)
    _check(warm, x, w, mask, res, nw, r)
    assert not torch.equal(y_before, warm[1].float().cpu())
