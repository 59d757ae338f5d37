"""One contract test over every registered policy: its slots, and its decisions in training, eval and
batch-coherent decode, as the routed model runs them."""

import pytest
import torch

import wide
from tests.conftest import tiny_model
from wide.modeling.wrap import layer_shapes, runtime_of
from wide.policies import POLICIES, SUBLAYERS, CoherentDecode

SIZES = dict(attn_group_size=2, ffn_group_size=32, router_rank=8)


def _routed(policy, arch="llama", router="lowrank", **kw):
    model = tiny_model(arch, num_hidden_layers=2, **kw)
    wide.apply_wide(model, wide.WideConfig(sparsity=0.5, granularity=policy, router=router, **SIZES))
    return model


@pytest.mark.parametrize("policy", POLICIES.names())
def test_slots_are_valid_for_tiny_models(policy, arch):
    model = tiny_model(arch, num_hidden_layers=2)
    cfg = wide.WideConfig(granularity=policy, **SIZES)
    impl = POLICIES.get(policy)()
    for shape in layer_shapes(model):
        impl.validate(shape, cfg)
        slots = impl.slots(shape, cfg)
        assert slots and len({s.kind for s in slots}) == len(slots)
        gated = [g for s in slots for g in s.gates]
        assert len(gated) == len(set(gated)) and set(gated) <= set(SUBLAYERS), "each sub-layer has one gate at most"
        units = {"attn": shape.num_heads, "ffn": shape.intermediate_size}
        for s in slots:
            assert s.reads in s.gates
            if s.group_size == 0:
                assert s.num_groups == 1  # one decision, broadcast over whole sub-layers
            else:
                assert len(s.gates) == 1 and s.num_groups * s.group_size == units[s.gates[0]]
            if s.gates == ("attn",) and s.group_size:  # GQA-aligned head groups
                assert shape.gqa_ratio % s.group_size == 0 or s.group_size % shape.gqa_ratio == 0
    wide.apply_wide(model, cfg)
    for layer in model.model.layers:
        wl = layer.wide
        assert set(wl.routers) == set(wl.slots)
        for kind, r in wl.routers.items():
            assert r.spec.kind == kind and r.spec.gates == wl.slots[kind].gates
            assert r.spec.num_groups == wl.slots[kind].num_groups == r.num_groups


@pytest.mark.parametrize("policy", POLICIES.names())
def test_training_decision_is_binary_with_straight_through_gradient(policy):
    model = _routed(policy).train()
    wl, rt = model.model.layers[0].wide, runtime_of(model)
    hidden = torch.randn(2, 5, 64)
    for kind, router in wl.routers.items():
        rt.set_noise(7)
        mask = wl.policy.mask(router, hidden, training=True, tau=1.0, noise_like=rt.gumbel_like)
        assert mask.shape == (2, 5, router.num_groups) and mask.dtype == torch.float32
        assert set(mask.unique().tolist()) <= {0.0, 1.0}
        (mask * torch.randn_like(mask)).sum().backward()
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in router.parameters()), kind
        rt.set_noise(7)  # the runtime's seeded noise: the same draw, the same decision
        again = wl.policy.mask(router, hidden, training=True, tau=1.0, noise_like=rt.gumbel_like)
        assert torch.equal(again, mask.detach())


def _residuals(model):
    """Records, per layer and sub-layer, the pre-norm residual its routers read (after the routing hooks ran)."""
    seen, hooks = {}, []
    for i, layer in enumerate(model.model.layers):
        for sub, norm in (("attn", layer.input_layernorm), ("ffn", layer.post_attention_layernorm)):
            hooks.append(norm.register_forward_pre_hook(lambda _m, args, _k=(i, sub): seen.__setitem__(_k, args[0])))
    return seen, hooks


def _eval_combos():
    for router in ("lowrank", "linear", "mlp", "static", "rep_lie", "batched_topk"):
        for policy in POLICIES.names():
            if router == "batched_topk" and policy == "layer":
                continue  # weight-based group scores only: rejected with a clear error (tests/routers)
            yield pytest.param(policy, router, id=f"{policy}-{router}")


@pytest.mark.parametrize(("policy", "router"), list(_eval_combos()))
@pytest.mark.parametrize("kernels", [None, "torch"], ids=["reference", "kernels-torch"])
def test_eval_decision_is_the_argmax_of_the_routers_logits(policy, router, kernels):
    model = _routed(policy, router=router).eval()
    if kernels:
        wide.enable_kernels(model, kernels)
    seen, hooks = _residuals(model)
    with torch.no_grad():
        model(torch.randint(3, 96, (2, 7)))
        for h in hooks:
            h.remove()
        for i, layer in enumerate(model.model.layers):
            wl = layer.wide
            for kind, slot in wl.slots.items():
                logits = wl.routers[kind](seen[(i, slot.reads)])
                margin = logits[..., 0] - logits[..., 1]
                clear = margin.abs() > 1e-4  # folded margins round differently at a tie
                for sub in slot.gates:
                    mask = wl.group_mask[sub]
                    assert mask.dtype == torch.bool and mask.shape == margin.shape
                    assert torch.equal(mask[clear], (margin >= 0)[clear])


@pytest.mark.parametrize("policy", POLICIES.names())
def test_coherent_decode_shares_one_mask_per_step(policy):
    model = _routed(policy).eval()
    wide.set_coherent_decode(model, refresh_every=1)
    ids = torch.randint(3, 96, (4, 6), generator=torch.Generator().manual_seed(0))
    steps = []
    hooks = [layer.mlp.register_forward_hook(lambda *_, wl=layer.wide: steps.append(dict(wl.group_mask)))
             for layer in model.model.layers]
    model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False)
    for h in hooks:
        h.remove()
    prefill, decode = steps[:2], steps[2:]
    assert all(m.shape[1] == 6 for s in prefill for m in s.values())  # prefill keeps per-token routing
    assert len(decode) == 2 * 3
    for step in decode:
        assert step
        for mask in step.values():
            assert mask.shape[:2] == (4, 1) and (mask == mask[:1]).all(), "one mask for every row of the step"
            assert mask[0, 0].any()  # the shared selection keeps at least one group
    # the policy's coherent decision, called directly
    wl = model.model.layers[0].wide
    for router in wl.routers.values():
        mask = wl.policy.mask(router, torch.randn(4, 1, 64), training=False, coherent=CoherentDecode(), state={})
        assert mask.shape == (4, 1, router.num_groups) and (mask == mask[:1]).all()


@pytest.mark.parametrize("policy", POLICIES.names())
def test_realized_sparsity_is_accounted_per_gated_sublayer(policy):
    model = _routed(policy)
    t = 4
    forced = {}
    for layer in model.model.layers:
        wl = layer.wide
        for kind, slot in wl.slots.items():
            g = slot.num_groups
            mask = torch.ones(1, t, g)
            mask[0, 0] = 0  # the first token skips everything, the second its first group
            mask[0, 1, 0] = 0
            wl.forced[kind] = forced[kind] = mask
    model(torch.randint(3, 96, (2, t)))
    stats = wide.sparsity_stats(model)
    wl = model.model.layers[0].wide
    assert set(stats.kinds) == set(wl.gating)
    for sub, slot in wl.gating.items():
        expect = 1.0 - forced[slot.kind].mean().item()
        torch.testing.assert_close(stats.skip[sub], torch.full((2,), expect))
        assert stats.token_active[sub].shape == (2, t, 2)


def test_slots_reject_what_no_layer_can_gate():
    from wide.policies import RouterSlot

    assert RouterSlot("attn", 4, 2).gates == ("attn",)
    assert RouterSlot("both", 1, 0, gates=("ffn", "attn")).reads == "attn"  # decided before attention runs
    for bad in (dict(kind="x", num_groups=2, group_size=4), dict(kind="x", num_groups=2, group_size=0, gates=("ffn",)),
                dict(kind="x", num_groups=1, group_size=8, gates=("attn", "ffn")),
                dict(kind="x", num_groups=0, group_size=8, gates=("ffn",))):
        with pytest.raises(ValueError, match="RouterSlot 'x'"):
            RouterSlot(**bad)


def test_a_policy_overriding_the_old_decide_is_told_what_replaced_it():
    with pytest.raises(TypeError, match="train_mask .* eval_mask .* coherent_mask"):
        class Old(wide.Policy):  # noqa: F841
            @staticmethod
            def decide(logits, *, tau, training, deterministic=False, noise=None):
                return logits[..., 0] >= logits[..., 1]


def test_overriding_one_mode_leaves_the_others_to_the_defaults(monkeypatch):
    """A plug-in that changes only the training decision trains with it and keeps the eval fast path, as the
    Policy docstring says; the eval decision changes only through eval_mask."""
    from wide.policies import WidthPolicy
    from wide.routers import LowRankRouter

    class AlwaysTrain(WidthPolicy):
        def train_mask(self, router, hidden, *, tau, noise_like=None):
            logits = router(hidden)
            return logits[..., 0] - logits[..., 0].detach() + 1.0  # executes everything, gradient kept

    model = _routed("width")
    for layer in model.model.layers:
        layer.wide.policy = AlwaysTrain()
    ids = torch.randint(3, 96, (2, 5))
    model.train()
    model(ids)
    assert wide.sparsity_stats(model).realized().item() == 0.0
    fast = []
    real = LowRankRouter.execute_decision
    monkeypatch.setattr(LowRankRouter, "execute_decision", lambda self, *a, **k: fast.append(1) or real(self, *a, **k))
    model.eval()
    with torch.no_grad():
        model(ids)
    assert len(fast) == 2 * 2  # layers x slots: the argmax through the router's fused path
    assert 0.0 < wide.sparsity_stats(model).realized().item() < 1.0
