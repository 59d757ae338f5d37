"""REP-LIE static pruning (`router: rep_lie` + `RepLiePruning`): importance from LoRA gradients, the iterative
schedule, and pruned groups fixed for every token."""

import math

import pytest
import torch
from torch import nn

import wide
from tests.conftest import tiny_model
from tests.test_recipes import tiny_args
from wide.callbacks import RepLiePruning
from wide.cli import main
from wide.io.checkpoint import load_trained, read_metadata
from wide.routers.rep_lie import RepLieRouter, lora_column_taylor, routers_of


class _Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.o_proj = nn.Linear(12, 10, bias=False)

    def forward(self, x):
        return self.o_proj(x)


def _lora_toy(seed=0):
    from peft import LoraConfig, inject_adapter_in_model

    torch.manual_seed(seed)
    toy = inject_adapter_in_model(LoraConfig(r=3, lora_alpha=6, lora_dropout=0.0, target_modules=["o_proj"]), _Toy())
    lin = toy.o_proj
    with torch.no_grad():
        lin.lora_B["default"].weight.normal_()  # peft starts B at 0; a trained B exercises both terms
    return toy, lin


def test_importance_from_lora_grads_equals_the_direct_computation():
    toy, lin = _lora_toy()
    w = lin.get_base_layer().weight
    w.requires_grad_(True)  # only to check the derivation: the callback never needs this gradient
    x, target = torch.randn(5, 7, 12), torch.randn(5, 7, 10)
    ((toy(x) - target) ** 2).mean().backward()
    a, b = lin.lora_A["default"].weight, lin.lora_B["default"].weight
    ga, gb, s, g = a.grad, b.grad, lin.scaling["default"], w.grad
    assert s == 2.0
    # the premises: peft's factor gradients are the full gradient G of W_eff seen through the factors
    torch.testing.assert_close(gb, s * g @ a.t())
    torch.testing.assert_close(ga, s * b.t() @ g)
    g_hat = s * (gb @ a + b @ ga)
    torch.testing.assert_close(g_hat, s * s * (g @ a.t() @ a + b @ b.t() @ g))
    # the factored per-column sum against the explicit [N, K] products
    w_eff = w.detach() + s * b.detach() @ a.detach()
    direct = (g_hat * w_eff).sum(0)
    got = lora_column_taylor(w.detach(), a.detach(), b.detach(), ga, gb, s)
    torch.testing.assert_close(got, direct, rtol=1e-5, atol=1e-6)
    # grouped: |sum over a group's columns|, as the callback reads it for a 4-group router
    from wide.routers.rep_lie import importance_of

    imp = importance_of([(w.detach(), a.detach(), b.detach(), ga, gb, s)], 4)
    torch.testing.assert_close(imp, direct.view(4, 3).sum(-1).abs(), rtol=1e-5, atol=1e-6)


def _rep_lie_model(**kw):
    model = tiny_model("llama", num_hidden_layers=3)
    cfg = dict(sparsity=0.5, router="rep_lie", attn_group_size=2, ffn_group_size=32, sparsity_measure="weight")
    cfg.update(kw)
    return wide.apply_wide(model, wide.WideConfig(**cfg))


@pytest.mark.parametrize("allocation", ["kind", "layer"])
def test_iterative_schedule_reaches_the_target_exactly(allocation):
    model = _rep_lie_model()
    routers = [r for _, _, r in routers_of(model)]
    cb = RepLiePruning(start=0.2, end=0.6, every=2, allocation=allocation)
    torch.manual_seed(0)
    for r in routers:
        for _ in range(3):
            r.observe(torch.rand(r.num_groups), beta=0.9)
    total, counts = 20, []
    for step in range(1, total + 1):
        if step >= 4 and ((step - 4) % 2 == 0 or step >= 12):
            cb.prune_to(cb.fraction(step, total), routers)
        counts.append({k: sum(int(r.pruned.sum()) for r in routers if r.spec.kind == k) for k in ("attn", "ffn")})
    for kind in ("attn", "ffn"):
        series = [c[kind] for c in counts]
        assert series == sorted(series), "groups are pruned for good"
        assert series[2] == 0 and 0 < series[5] < 6  # nothing before `start`, part way in between
        assert series[11:] == [6] * 9  # 3 layers x 4 groups x 0.5, reached at `end` and kept
        pools, size = (1, 12) if allocation == "kind" else (3, 4)  # ranked across layers, or per layer
        want = [pools * math.floor(cb.fraction(s, total) * 0.5 * size + 0.5) for s in range(4, 13, 2)]
        assert [series[s - 1] for s in range(4, 13, 2)] == want
    if allocation == "layer":
        assert all(int(r.pruned.sum()) == 2 for r in routers)
    model.eval()
    with torch.no_grad():
        model(torch.randint(3, 96, (3, 9)))
    stats = wide.sparsity_stats(model)
    assert stats.realized_by_weight().item() == 0.5 and stats.realized().item() == 0.5


def test_pruned_groups_are_fixed_for_every_token_and_step():
    model = _rep_lie_model()
    for i, (_, _, r) in enumerate(routers_of(model)):
        r.prune(torch.tensor([i % 4, (i + 1) % 4]))
    model.eval()
    ids = torch.randint(3, 96, (4, 7), generator=torch.Generator().manual_seed(0))
    seen = []
    hooks = [layer.mlp.register_forward_hook(lambda *_, wl=layer.wide: seen.append((wl, dict(wl.group_mask))))
             for layer in model.model.layers]
    model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False)
    for h in hooks:
        h.remove()
    assert len(seen) == 3 * 3
    for wl, masks in seen:
        for kind, mask in masks.items():
            keep = wl.routers[kind].keep > 0.5
            assert torch.equal(mask, keep.expand_as(mask)), "the same groups for every token, prefill and decode"
    assert all(r.expected_sparsity() == 0.5 for _, _, r in routers_of(model))


def test_rep_lie_trains_prunes_and_checkpoints(tmp_path, tiny_model_dir, tiny_corpus):
    recipe = tmp_path / "rep_lie.yaml"
    recipe.write_text("""\
model:
  class_path: wide.tasks.LoRARecovery
  init_args:
    routing: {router: rep_lie, sparsity: 0.5, sparsity_measure: weight, attn_group_size: 2, ffn_group_size: 32}
    train_routers: false
    lora_r: 4
    lam: 0.0
trainer:
  callbacks:
    - class_path: wide.callbacks.RepLiePruning
      init_args: {start: 0.2, end: 0.6, every: 1}
""")
    main(["fit", "--config", str(recipe), *tiny_args(tmp_path, tiny_model_dir, tiny_corpus),
          "--trainer.max_steps", "6", "--trainer.limit_val_batches", "0"])
    ckpt = tmp_path / "wide" / "routers.safetensors"
    meta = read_metadata(ckpt)
    from transformers import AutoModelForCausalLM

    model = wide.apply_wide(AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval(), meta["wide_config"])
    load_trained(model, ckpt, prefixes=(".wide.routers.",))  # the pruning decision; LoRA is not needed here
    routers = [r for _, _, r in routers_of(model)]
    assert len(routers) == 2 * 2  # tiny_model_dir: 2 layers, attention and FFN
    for kind in ("attn", "ffn"):
        assert sum(int(r.pruned.sum()) for r in routers if r.spec.kind == kind) == 4  # 2 layers x 4 groups x 0.5
    with torch.no_grad():
        model(torch.randint(3, 96, (2, 5)))
    assert wide.sparsity_stats(model).realized_by_weight().item() == 0.5


def test_misconfigurations_name_the_field(tmp_path, tiny_model_dir, tiny_corpus):
    for bad, field in ((dict(start=0.6, end=0.2), "start/end"), (dict(every=0), "every"),
                       (dict(allocation="global"), "allocation"), (dict(beta=1.0), "beta")):
        with pytest.raises(ValueError, match=f"^{field}:"):
            RepLiePruning(**bad)
    with pytest.raises(ValueError, match="^router: RepLiePruning needs `router: rep_lie`"):
        RepLiePruning().sources(wide.apply_wide(tiny_model("llama"), wide.WideConfig(ffn_group_size=32)))
    with pytest.raises(ValueError, match="^lora_targets: .*o_proj"):
        RepLiePruning().sources(_rep_lie_model())

    class _Task:
        train_routers = True

    with pytest.raises(ValueError, match="^model.init_args.train_routers"):
        RepLiePruning().setup(None, _Task(), "fit")


def test_router_is_static_and_deterministic():
    spec = wide.RouterSpec("ffn", 0, 1, 16, 4, 8, 0.5)
    r = RepLieRouter(spec)
    r.prune(torch.tensor([1, 3]))
    h = torch.randn(2, 5, 16)
    logits = r(h)
    assert logits.shape == (2, 5, 4, 2)
    assert torch.equal(r.execute_decision(h), torch.tensor([True, False, True, False]).expand(2, 5, 4))
    torch.testing.assert_close(r.execute_decision(h, margin=True), logits[..., 0] - logits[..., 1])
    assert not r.keep.requires_grad and r.expected_sparsity() == 0.5
