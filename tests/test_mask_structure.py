"""The tile-occupancy measures of ``benchmarks/mask_structure.py``."""

import importlib.util
from pathlib import Path

import torch

_spec = importlib.util.spec_from_file_location(
    "mask_structure", Path(__file__).resolve().parents[1] / "benchmarks" / "mask_structure.py")
ms = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ms)


def test_tile_share_counts_tiles_with_any_running_token():
    mask = torch.zeros(8, 2, dtype=torch.bool)
    mask[0, 0] = True  # tile 0 needs group 0
    mask[7, 1] = True  # tile 1 needs group 1
    assert ms.tile_share(mask, 4) == 0.5
    assert ms.tile_share(mask, 8) == 1.0
    assert ms.tile_share(torch.zeros(9, 3, dtype=torch.bool), 4) == 0.0


def test_orders_cluster_interleaved_token_types():
    """Two token types alternating: in sequence order every tile needs both groups; either ordering groups
    the types, so each tile needs one."""
    mask = torch.zeros(64, 2, dtype=torch.bool)
    mask[0::2, 0] = True
    mask[1::2, 1] = True
    assert ms.tile_share(mask, 16) == 1.0
    for order in (ms.pca_order(mask), ms.lex_order(mask)):
        assert sorted(order.tolist()) == list(range(64))
        assert ms.tile_share(mask[order], 16) == 0.5


def test_kernel_order_share_matches_the_scripts_measure():
    """The ``lex`` rows are the kernel's order: RoutingPlan.tile_share is tile_share over lex-ordered tokens."""
    from wide.kernels import make_plan

    gen = torch.Generator().manual_seed(0)
    pats = torch.rand(5, 12, generator=gen) < 0.4
    mask = pats[torch.randint(0, 5, (256,), generator=gen)]
    plan = make_plan(mask)
    rows = plan.tile_order(32)[0].long()
    assert torch.equal(rows, ms.lex_order(mask))
    assert plan.tile_share(32) == ms.tile_share(mask[rows], 32)
    assert plan.tile_share(32) < ms.tile_share(mask, 32)  # sorting groups the 5 kinds of token
