"""One contract test over every registered router and policy."""

import pytest
import torch

import wide
from tests.conftest import tiny_model


def _combos():
    for router in wide.ROUTERS.names():
        for policy in wide.POLICIES.names():
            if router == "topk" and policy == "layer":
                continue  # no weight-based score for a whole layer; rejected with a clear error (below)
            yield pytest.param(router, policy, id=f"{router}-{policy}")


@pytest.mark.parametrize(("router", "policy"), list(_combos()))
def test_router_policy_contract(router, policy):
    model = tiny_model("qwen3", num_hidden_layers=2)
    wide.apply_wide(model, wide.WideConfig(sparsity=0.5, granularity=policy, router=router, attn_group_size=2,
                                           ffn_group_size=32, router_rank=8))
    layer = model.model.layers[0].wide
    hidden = torch.randn(2, 5, 64)
    for kind, r in layer.routers.items():
        logits = r(hidden)
        assert logits.shape == (2, 5, layer.slots[kind].num_groups, 2)
        # the eval decision's margin (folded where a router overrides it) is the logit difference
        if router != "random":  # fresh draws per call
            torch.testing.assert_close(r.execute_margin(hidden), logits[..., 0] - logits[..., 1], atol=1e-5, rtol=1e-5)
            # the eval fast path (`wide.kernels.router_margin` for linear / low-rank) on the reference backend
            with torch.no_grad():
                margin = r.execute_margin(hidden).float()
                torch.testing.assert_close(r.execute_decision(hidden, margin=True), margin)
                assert torch.equal(r.execute_decision(hidden), margin >= 0)
    model.train()
    ids = torch.randint(3, 96, (2, 5))
    out = model(ids, labels=ids)
    stats = wide.sparsity_stats(model)
    loss = out.loss + 20 * (0.5 - stats.realized(differentiable=True)).abs()
    params = [p for _, p in wide.router_parameters(model)]
    if params:
        loss.backward()
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in params), "no gradient reached the routers"
    model.eval()
    with torch.no_grad():
        model(ids)
    for kind, mask in model.model.layers[1].wide.group_mask.items():
        assert set(mask.unique().tolist()) <= {0.0, 1.0}
        assert mask.shape[:2] == (2, 5)


def test_topk_keeps_exactly_k():
    model = tiny_model("llama", num_hidden_layers=1)
    wide.apply_wide(model, wide.WideConfig(sparsity=0.6, router="topk", attn_group_size=1, ffn_group_size=16))
    model(torch.randint(3, 96, (2, 7)))
    masks = model.model.layers[0].wide.group_mask
    assert (masks["attn"].sum(-1) == 4).all()  # ceil(0.4 * 8)
    assert (masks["ffn"].sum(-1) == 4).all()  # ceil(0.4 * 8)


def test_topk_with_layer_policy_rejected():
    with pytest.raises(ValueError, match="^router: 'topk'"):
        wide.apply_wide(tiny_model("llama"), wide.WideConfig(router="topk", granularity="layer"))


def test_user_router_subclass_plugs_in():
    class Half(wide.Router):
        def __init__(self, spec, bias: float = 0.0):
            super().__init__(spec)
            self.w = torch.nn.Parameter(torch.zeros(spec.num_groups, 2))

        def forward(self, hidden):
            return self.w.expand(*hidden.shape[:-1], -1, -1)

    model = tiny_model("llama", num_hidden_layers=1)
    wide.apply_wide(model, wide.WideConfig(router=Half, ffn_group_size=32))
    assert isinstance(model.model.layers[0].wide.routers["ffn"], Half)


def test_factory_must_return_router():
    with pytest.raises(TypeError, match="not a wide.routers.Router"):
        wide.apply_wide(tiny_model("llama"), wide.WideConfig(router=lambda spec: torch.nn.Linear(1, 1), ffn_group_size=32))


def test_folded_margin_follows_parameter_updates():
    """The folded execute-minus-skip rows are cached, but an optimizer step (in place) or a reload shows."""
    model = tiny_model("llama", num_hidden_layers=1)
    wide.apply_wide(model, wide.WideConfig(attn_group_size=2, ffn_group_size=32))
    r = model.model.layers[0].wide.routers["ffn"]
    hidden = torch.randn(2, 3, 64)
    before = r.execute_margin(hidden)
    with torch.no_grad():
        r.up.bias[0::2] += 5.0  # execute logits up: every margin rises by 5
    after = r.execute_margin(hidden)
    torch.testing.assert_close(after, before + 5.0, atol=1e-5, rtol=1e-5)
    logits = r(hidden)
    torch.testing.assert_close(after, logits[..., 0] - logits[..., 1], atol=1e-5, rtol=1e-5)
    model.eval()
    model(torch.randint(3, 96, (2, 3)))
    mask = model.model.layers[0].wide.group_mask["ffn"]
    assert mask.dtype == torch.bool and bool(mask.all())  # eval decisions stay bool; +5 executes all
    assert wide.sparsity_stats(model).skip["ffn"].item() == 0.0


def test_random_router_margin_decides_like_forward():
    from wide.routers.base import RouterSpec
    from wide.routers.random import RandomRouter

    spec = RouterSpec(kind="ffn", layer_idx=3, num_layers=4, hidden_size=16, num_groups=7, group_size=8,
                      target_sparsity=0.5, rank=4)
    hidden = torch.randn(2, 5, 16)
    a, b = RandomRouter(spec, sparsity=0.3, seed=11), RandomRouter(spec, sparsity=0.3, seed=11)
    logits = a(hidden)
    margin = b.execute_margin(hidden)
    assert torch.equal(margin >= 0, logits[..., 0] > logits[..., 1])
    assert 0.5 < (margin >= 0).float().mean() < 0.9
    c = RandomRouter(spec, sparsity=0.3, seed=11)
    assert torch.equal(c.execute_decision(hidden), margin >= 0)
    d = RandomRouter(spec, sparsity=0.3, seed=11)
    torch.testing.assert_close(d.execute_decision(hidden, margin=True), margin)
