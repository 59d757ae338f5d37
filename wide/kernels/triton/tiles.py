"""``@triton.jit`` helpers shared by the routed kernels (GEMMs, attention, `decode_qkv`)."""

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


@triton.jit
def mma(a, b, acc):
    """``acc + a @ b`` as ``tl.dot``, in full fp32 when the operands are fp32: Triton's default rounds fp32 operands to
    TF32 (10-bit mantissa) on Ampere and later, where cuBLAS (torch's default) does not: an fp32 model's routed
    layers would compute less exactly than its dense ones, and a router's margin near zero could decide otherwise.
    16-bit operands are unchanged."""
    if a.dtype == tl.float32:
        return tl.dot(a, b, acc, input_precision="ieee")
    return tl.dot(a, b, acc)
