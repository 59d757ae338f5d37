"""One contract test over every registered router and policy; eval decisions follow an overridden forward."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import wide
from tests.conftest import tiny_model
from wide.routers.base import shift_execute_margin

ROOT = Path(__file__).resolve().parents[2]


SCORED = ("topk", "batched_topk")
"""Training-free routers that rank groups by weight-based scores, which whole-layer decisions lack."""

THRESHOLDED = ("lowrank", "linear", "mlp", "static")
"""Routers deciding by a threshold on a learned margin: `wide.modeling.fit_rate` shifts it to the target rate."""


def _combos():
    for router in wide.ROUTERS.names():
        for policy in wide.POLICIES.names():
            if router in SCORED and policy == "layer":
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
                # a router with a threshold moves it through its logit bias, fast path included
                if shift_execute_margin(r, 0.25):
                    torch.testing.assert_close(r.execute_decision(hidden, margin=True), margin + 0.25,
                                               atol=1e-5, rtol=1e-5)
                    logits = r(hidden)
                    torch.testing.assert_close(logits[..., 0] - logits[..., 1], margin + 0.25, atol=1e-5, rtol=1e-5)
                    shift_execute_margin(r, -0.25)
    assert (router in THRESHOLDED) == all(r.logit_bias() is not None for r in layer.routers.values())
    model.train()
    ids = torch.randint(3, 96, (2, 5))
    out = model(ids, labels=ids)
    stats = wide.sparsity_stats(model)
    loss = out.loss + 20 * (0.5 - stats.realized(differentiable=True)).abs()
    params = [p for _, p in wide.router_parameters(model) if p.requires_grad]  # fixed tensors (rep_lie) get none
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


class SkipAll(wide.routers.LowRankRouter):
    """A plug-in as a new user writes it: subclass the low-rank router and override only ``forward``."""

    def forward(self, hidden):
        logits = torch.zeros(*hidden.shape[:-1], self.num_groups, 2, device=hidden.device)
        logits[..., 1] = 1.0  # skip beats execute everywhere
        return logits


def _decode_masks(model, ids, new_tokens):
    """Every routed layer's group masks of each decode step of a greedy ``generate``."""
    seen = []
    hooks = [layer.mlp.register_forward_hook(lambda *_, wl=layer.wide: seen.append(dict(wl.group_mask)))
             for layer in model.model.layers]
    model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False)
    for h in hooks:
        h.remove()
    return [m for m in seen if next(iter(m.values())).shape[1] == 1]


def test_overriding_forward_drops_the_inherited_fast_path():
    from wide.routers.base import FAST_PATH, Router

    for name in FAST_PATH:
        assert getattr(SkipAll, name) is getattr(Router, name), name
    assert SkipAll.logit_bias is Router.logit_bias  # the parent's bias no longer moves SkipAll's threshold
    assert wide.routers.LowRankRouter.execute_decision is not Router.execute_decision  # the built-in keeps its own

    class Again(SkipAll):  # below the override, nothing changes
        pass

    class Faster(wide.routers.MLPRouter):  # a fast path defined below forward's class is trusted
        def execute_margin(self, hidden):
            return super().execute_margin(hidden) + 0.0

    assert Again.execute_decision is Router.execute_decision
    assert Faster.execute_margin is not Router.execute_margin


@pytest.mark.parametrize("kernels", [None, "torch"], ids=["reference", "kernels-torch"])
def test_eval_follows_an_overridden_forward(kernels):
    """Eval decisions, per token and batch-coherent, come from the plug-in's forward, not the parent's fast path."""
    model = tiny_model("llama", num_hidden_layers=2)
    wide.apply_wide(model, wide.WideConfig(sparsity=0.5, router=SkipAll, attn_group_size=2, ffn_group_size=32))
    model.eval()
    if kernels:
        wide.enable_kernels(model, kernels)
    ids = torch.randint(3, 96, (3, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model(ids)
    stats = wide.sparsity_stats(model)
    assert stats.realized().item() == 1.0 and all(stats.skip[k].eq(1.0).all() for k in ("attn", "ffn"))
    steps = _decode_masks(model, ids, 3)  # per-token decode steps
    assert steps and all(not m.any() for step in steps for m in step.values())
    wide.set_coherent_decode(model, 1)
    steps = _decode_masks(model, ids, 3)
    # every row skips everything under its own decision: the shared selection keeps its minimum, one group
    # (ties to the lowest index); the parent's fast path would keep about half
    assert steps
    for step in steps:
        for mask in step.values():
            assert mask.shape == (3, 1, 4) and mask.dtype == torch.bool
            assert torch.equal(mask, torch.tensor([True, False, False, False]).expand(3, 1, 4))
    assert model.model.layers[0].wide.routers["ffn"].margin_weights() is None  # no one-launch coherent route


def test_eval_follows_an_overridden_forward_on_triton():
    """The same on the triton backend (CPU interpreter): no `router_margin` / `coherent_route` launch decides."""
    script = textwrap.dedent(
        """
        import sys, torch, wide
        sys.path.insert(0, %r)
        import wide.kernels, wide.policies.coherent as coherent
        from tests.conftest import tiny_model
        from tests.routers.test_contract import SkipAll, _decode_masks
        calls = []
        for mod, name in ((wide.kernels, "router_margin"), (coherent, "coherent_route")):
            real = getattr(mod, name)
            setattr(mod, name, lambda *a, _r=real, _n=name, **k: calls.append(_n) or _r(*a, **k))
        m = tiny_model("llama", num_hidden_layers=2)
        wide.apply_wide(m, wide.WideConfig(sparsity=0.5, router=SkipAll, attn_group_size=2, ffn_group_size=32))
        wide.enable_kernels(m.eval(), "triton")
        ids = torch.randint(3, 96, (3, 6))
        with torch.no_grad():
            m(ids)
        assert wide.sparsity_stats(m).realized().item() == 1.0
        assert all(not x.any() for s in _decode_masks(m, ids, 3) for x in s.values())
        wide.set_coherent_decode(m, 1)
        steps = _decode_masks(m, ids, 3)
        assert steps and all(torch.equal(x[:, 0], torch.tensor([True, False, False, False]).expand(3, 4))
                             for s in steps for x in s.values())
        assert not calls, calls
        print("OK")
        """
    ) % str(ROOT)
    env = dict(os.environ, TRITON_INTERPRET="1")
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0 and "OK" in res.stdout, res.stderr[-3000:]
