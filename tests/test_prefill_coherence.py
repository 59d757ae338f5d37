"""The tile-coherent selection rule of ``benchmarks/prefill_coherence.py``."""

import importlib.util
from pathlib import Path

import torch

_spec = importlib.util.spec_from_file_location(
    "prefill_coherence", Path(__file__).resolve().parents[1] / "benchmarks" / "prefill_coherence.py")
pc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pc)


def test_each_tile_shares_its_top_groups_and_the_tail_keeps_its_own():
    margin = torch.full((1, 10, 4), -1.0)
    margin[0, :4, 2] = 3.0  # tile 0: group 2 everywhere, group 0 for one token
    margin[0, 0, 0] = 0.5
    margin[0, 4:8, 1] = 2.0  # tile 1: group 1 for all, group 3 for all
    margin[0, 4:8, 3] = 1.0
    fallback = torch.zeros(1, 10, 4, dtype=torch.bool)
    fallback[0, 8:, 0] = True
    out = pc.tile_coherent(margin, fallback, tile=4, keep_scale=1.0)
    assert out.dtype == torch.bool and out.shape == (1, 10, 4)
    # tile 0: tokens run 1.25 groups on average -> keep 1: the highest mean probability, group 2
    assert out[0, :4].tolist() == [[False, False, True, False]] * 4
    # tile 1: 2 groups each -> keep groups 1 and 3
    assert out[0, 4:8].tolist() == [[False, True, False, True]] * 4
    assert torch.equal(out[0, 8:], fallback[0, 8:])  # the ragged tail: per-token decisions
    wider = pc.tile_coherent(margin, fallback, tile=4, keep_scale=2.0)  # 2.5 -> 3 groups in tile 0
    assert int(wider[0, 0].sum()) == 3 and bool(wider[0, 0, 2]) and bool(wider[0, 0, 0])


def test_keep_is_at_least_one_group():
    out = pc.tile_coherent(torch.full((2, 8, 3), -5.0), torch.zeros(2, 8, 3, dtype=torch.bool), 4, 1.0)
    assert (out.sum(-1) == 1).all()
