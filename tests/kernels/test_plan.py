import pytest
import torch

from wide.kernels import RoutingPlan, make_plan


@pytest.mark.parametrize("shape", [(1, 1, 1), (2, 7, 3), (3, 33, 5), (40, 4)], ids=str)
@pytest.mark.parametrize("density", [0.0, 0.4, 1.0])
def test_token_order_is_a_stable_partition(shape, density):
    gen = torch.Generator().manual_seed(0)
    mask = torch.rand(shape, generator=gen) < density
    plan = make_plan(mask)
    for flat in ([True, False] if mask.dim() == 3 else [True]):
        perm, counts = plan.token_order(flat)
        m = mask.reshape(1, -1, mask.shape[-1]) if flat else mask
        assert perm.dtype == torch.int32 and counts.dtype == torch.int32 and perm.is_contiguous()
        for r in range(m.shape[0]):
            for g in range(m.shape[-1]):
                active = torch.nonzero(m[r, :, g]).view(-1)
                inactive = torch.nonzero(~m[r, :, g]).view(-1)
                assert counts[r, g] == active.numel()
                assert torch.equal(perm[r, g].long(), torch.cat([active, inactive]))


def test_group_list_and_cache():
    mask = torch.zeros(5, 6, dtype=torch.bool)
    mask[0, 4] = mask[3, 1] = mask[2, 4] = True
    plan = make_plan(mask)
    order, n = plan.group_list()
    assert n.tolist() == [2] and order[:2].tolist() == [1, 4] and sorted(order.tolist()) == list(range(6))
    assert plan.group_list()[0] is order  # cached: paired ops reuse it
    assert plan.materialize() is plan and plan.matches(mask) and not plan.matches(mask.clone())


def test_plan_rejects_float_and_wrong_rank():
    with pytest.raises(TypeError, match="bool"):
        RoutingPlan(torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"\[B, T, G\]"):
        make_plan(torch.ones(4, 3, dtype=torch.bool)).token_order(flat=False)


@pytest.mark.skipif(not __import__("os").environ.get("TRITON_INTERPRET"), reason="interpreter check")
@pytest.mark.parametrize("shape", [(1, 300, 3), (2, 17, 5), (3, 1, 2)], ids=str)
def test_triton_partition_matches_torch(shape):
    from wide.kernels.plan import _stable_partition
    from wide.kernels.triton.plan import partition

    mask = torch.rand(shape, generator=torch.Generator().manual_seed(3)) < 0.4
    perm, counts = partition(mask)
    ref_perm, ref_counts = _stable_partition(mask)
    assert torch.equal(perm, ref_perm) and torch.equal(counts, ref_counts)
