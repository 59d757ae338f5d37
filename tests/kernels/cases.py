"""Shared helpers for kernel tests: random problems, poisoned outputs, comparisons."""

from __future__ import annotations

import os

import torch

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

TOL = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-12)).item()


def poisoned(shape, dtype, device) -> torch.Tensor:
    """An output buffer full of NaN: any element a kernel forgets to write fails the check."""
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def check(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, zero_where=None, what: str = ""):
    assert torch.isfinite(out).all(), f"{what}: unwritten (NaN) or non-finite elements"
    err = rel_err(out, ref)
    tol = TOL[dtype] * (4 if dtype == torch.float32 and not INTERPRET else 1)
    if ref.abs().max() == 0:
        assert out.abs().max() == 0, f"{what}: expected all zeros"
    else:
        assert err < tol, f"{what}: relative error {err:.2e} >= {tol:.1e}"
    if zero_where is not None:
        assert (out[zero_where] == 0).all(), f"{what}: masked outputs are not exact zeros"


def random_mask(shape, density: float, gen: torch.Generator, device="cpu") -> torch.Tensor:
    if density >= 1.0:
        return torch.ones(shape, dtype=torch.bool, device=device)
    if density <= 0.0:
        return torch.zeros(shape, dtype=torch.bool, device=device)
    return (torch.rand(shape, generator=gen) < density).to(device)


class GridSpy:
    """Stands in for a ``@triton.jit`` kernel (monkeypatched over it): records each launch's grid, then launches."""

    def __init__(self, kernel):
        self.kernel, self.grids = kernel, []

    def __getitem__(self, grid):
        self.grids.append(grid)
        return self.kernel[grid]
