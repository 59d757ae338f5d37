"""``@triton.jit`` helpers shared by the routed GEMM kernels (`gemm_mn_kernels`, `gemm_k_kernels`)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def grouped_tile(pid, num_m, num_n, GROUP_M: tl.constexpr):
    """(token tile, N tile) of program ``pid`` in grouped order: consecutive programs share token tiles (x
    rows of similar ranges) for L2 reuse."""
    width = GROUP_M * num_n
    first_m = (pid // width) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + (pid % width) % size_m, (pid % width) // size_m
