"""Default launch configs adapt to the operand size (the shared-memory side is checked by test_sm90_compile)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from wide.kernels.triton import gemm as tg  # noqa: E402


def test_four_byte_operands_halve_the_k_chunk_and_keep_the_rest():
    cfg = tg.GemmConfig(16, 128, 128, num_warps=4, num_stages=4, split_k=8, variant="list")
    assert tg.for_element_size(cfg, 2) is cfg
    half = tg.for_element_size(cfg, 4)
    assert (half.block_m, half.block_n, half.block_k) == (16, 128, 64)
    assert (half.num_warps, half.num_stages, half.split_k, half.variant) == (4, 4, 8, "list")


def test_the_k_chunk_never_drops_below_a_tensor_core_step():
    assert tg.for_element_size(tg.GemmConfig(16, 16, 16), 4).block_k == 16
