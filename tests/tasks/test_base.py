"""WideTask pieces that need no training run: per-batch seeds, pre-flight checks, resume-file checks."""

import pytest
import torch

import wide
from tests.conftest import tiny_config, tiny_model
from wide.io.checkpoint import is_router_name
from wide.tasks.base import batch_seed
from wide.tasks.checks import check_resume_file, check_router_checkpoint, check_routing, check_seq_len


def test_batch_seed_depends_on_every_coordinate_and_nothing_else():
    base = batch_seed(17, 0, 5, 0)
    assert base == batch_seed(17, 0, 5, 0) and 0 <= base < 2**63
    assert len({base, batch_seed(18, 0, 5, 0), batch_seed(17, 1, 5, 0), batch_seed(17, 0, 6, 0),
                batch_seed(17, 0, 5, 1), batch_seed(17, 0, 50, 0), batch_seed(17, 0, 0, 5)}) == 7


def test_checks_read_the_config_only():
    cfg = tiny_config("qwen2")
    check_routing(cfg, wide.WideConfig(attn_group_size=2, ffn_group_size=32, dense_layers=[-1]))
    with pytest.raises(ValueError, match="^ffn_group_size: 48 does not divide the FFN width 128"):
        check_routing(cfg, wide.WideConfig(ffn_group_size=48))
    with pytest.raises(ValueError, match="^dense_layers: index -4 is out of range for 3 layers"):
        check_routing(cfg, wide.WideConfig(ffn_group_size=32, dense_layers=[-4]))
    check_seq_len(cfg, 256, "m")
    with pytest.raises(ValueError, match="^data.seq_len: 257 exceeds .* model 'm' \\(max_position_embeddings=256\\)"):
        check_seq_len(cfg, 257, "m")


def test_router_checkpoint_shapes_checked_from_the_config(tmp_path):
    from wide.io.checkpoint import save_trained

    routing = wide.WideConfig(attn_group_size=2, ffn_group_size=32)
    path = save_trained(wide.apply_wide(tiny_model("llama"), routing), tmp_path / "r.safetensors", config=routing,
                        stage="calibrate")
    check_router_checkpoint(tiny_config("llama"), str(path))
    other = "^router_checkpoint: made for another model .*intermediate_size: checkpoint 128 vs model 256"
    with pytest.raises(ValueError, match=other):
        check_router_checkpoint(tiny_config("llama", intermediate_size=256), str(path))


def test_resume_file_checked_before_anything_loads(tmp_path):
    check_resume_file("last", "calibrate")
    check_resume_file(None, "calibrate")
    torch.save({"wide": {"stage": "lora"}}, tmp_path / "lora.ckpt")
    check_resume_file(str(tmp_path / "lora.ckpt"), "lora")
    with pytest.raises(ValueError, match="^ckpt_path: written by stage 'lora', this run is stage 'calibrate'"):
        check_resume_file(str(tmp_path / "lora.ckpt"), "calibrate")
    torch.save({"state_dict": {}}, tmp_path / "plain.ckpt")
    with pytest.raises(ValueError, match="plain.ckpt is not a wide resume checkpoint"):
        check_resume_file(str(tmp_path / "plain.ckpt"), "calibrate")


def test_initial_trained_weights_depend_on_the_seed_only(tiny_model_dir, monkeypatch):
    """Routers and LoRA start from the same values whatever the RNG state, the default device a strategy
    sets while building (a single-GPU strategy builds under its GPU, FSDP2 on the CPU), or the rank."""
    from wide.tasks import LoRARecovery

    def trained_init(seed, ctx):
        monkeypatch.setenv("PL_GLOBAL_SEED", str(seed))
        task = LoRARecovery(model=tiny_model_dir, routing=wide.WideConfig(attn_group_size=2, ffn_group_size=32),
                            lora_r=4)
        torch.rand(1000)  # RNG state left by whatever ran before
        with ctx:
            task.configure_model()
        return {n: p.detach().clone() for n, p in task.model.named_parameters() if p.requires_grad}

    a = trained_init(17, torch.device("cpu"))
    b = trained_init(17, torch.device("meta"))  # stands for "another device": building must not follow it
    c = trained_init(18, torch.device("cpu"))
    assert a.keys() == b.keys() and any("lora_A" in k for k in a) and any(".wide.routers." in k for k in a)
    assert all(t.device.type == "cpu" for t in b.values())
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a if "lora_B" not in k)


def test_sparsity_target_applies_to_the_global_batch_across_ranks(tiny_model_dir):
    """With 2 ranks the gap is |target - mean of the ranks' rates| (not the mean of per-rank gaps), and this
    rank's gradient is sign(mean - target) * d(local rate), which rank-averaging turns into the 1-device one."""
    from types import SimpleNamespace

    from wide.tasks import RouterCalibration

    task = RouterCalibration(model=tiny_model_dir, routing=wide.WideConfig(sparsity=0.5, ffn_group_size=32), lam=2.0)
    task._trainer = SimpleNamespace(world_size=2)
    other_rank = torch.tensor(0.2)
    task.mean_over_ranks = lambda v: (v + other_rank) / 2  # this rank's rate and the other rank's 0.2
    local = torch.tensor(0.7, requires_grad=True)
    stats = SimpleNamespace(kinds=["ffn"], realized=lambda kind=None, differentiable=False: local)
    loss, logs = task.sparsity_loss(stats)
    assert abs(loss.item() - 2.0 * abs(0.5 - 0.45)) < 1e-6  # per-rank gaps would give 2 * (0.2 + 0.3) / 2
    loss.backward()
    assert local.grad.item() == -2.0  # sign(0.45 - 0.5) * lam: pushes this rank's rate up, as on one device


def test_sparsity_measured_by_weight_trains_toward_the_weighted_rate(tiny_model_dir):
    """``sparsity_measure="weight"``: the loss's rate is the skipped share of routed weight work (FFN layers
    weigh more than attention ones in the tiny Llama), with gradients into both kinds' routers."""
    from wide.tasks import RouterCalibration

    cfg = wide.WideConfig(sparsity=0.5, ffn_group_size=32, sparsity_measure="weight")
    task = RouterCalibration(model=tiny_model_dir, routing=cfg, lam=1.0)
    model = wide.apply_wide(tiny_model("llama"), cfg).train()
    model(torch.randint(3, 96, (2, 8)))
    stats = wide.sparsity_stats(model)
    loss, logs = task.sparsity_loss(stats)
    assert torch.allclose(loss, (0.5 - stats.realized_by_weight()).abs())
    assert not torch.allclose(stats.realized_by_weight(), stats.realized())  # a different rate than the paper's
    loss.backward()
    for kind in ("attn", "ffn"):
        grads = [p.grad for layer in model.model.layers for p in layer.wide.routers[kind].parameters()]
        assert any(g is not None and g.abs().sum() > 0 for g in grads), kind
    with pytest.raises(ValueError, match="sparsity_measure"):
        wide.WideConfig(sparsity_measure="weight", ffn_sparsity=0.5)


@pytest.mark.parametrize("granularity,router", [("layer", "lowrank"), ("sublayer", "lowrank"), ("width", "static")])
def test_the_by_weight_target_trains_every_baseline(granularity, router, tiny_model_dir):
    """The frontier grid's baselines take ``sparsity_measure="weight"`` as WIDE does: dynamic depth (one decision
    gates attention and FFN, so its by-weight rate is its layer rate), sublayer skipping (the two sub-layers weighed
    by their routed weights) and static width; the loss reaches their routers."""
    from wide.tasks import RouterCalibration

    cfg = wide.WideConfig(sparsity=0.5, granularity=granularity, router=router, ffn_group_size=32,
                          sparsity_measure="weight")
    task = RouterCalibration(model=tiny_model_dir, routing=cfg, lam=1.0)
    model = wide.apply_wide(tiny_model("llama"), cfg).train()
    model(torch.randint(3, 96, (2, 8)))
    stats = wide.sparsity_stats(model)
    loss, _ = task.sparsity_loss(stats)
    assert set(stats.kinds) == {"attn", "ffn"} and torch.allclose(loss, (0.5 - stats.realized_by_weight()).abs())
    if granularity == "layer":
        assert torch.allclose(stats.realized_by_weight(), stats.realized())
    loss.backward()
    grads = [p.grad for layer in model.model.layers for r in layer.wide.routers.values() for p in r.parameters()]
    assert any(g is not None and g.abs().sum() > 0 for g in grads)
    with pytest.raises(ValueError, match="sparsity_measure"):
        wide.WideConfig(sparsity_measure="flops")


def test_layer_cap_penalises_each_layer_past_it(tiny_model_dir):
    """``layer_cap``: every (layer, kind) rate past the cap adds ``lam * (rate - cap)``, summed; layers under it add
    nothing; the gradient reaches only the routers of the layers past it."""
    from types import SimpleNamespace

    from wide.tasks import RouterCalibration

    cfg = wide.WideConfig(sparsity=0.5, ffn_group_size=32)
    task = RouterCalibration(model=tiny_model_dir, routing=cfg, lam=2.0, layer_cap=0.7)
    attn = torch.tensor([0.5, 0.9], requires_grad=True)
    ffn = torch.tensor([0.75, 0.2], requires_grad=True)
    mean = (torch.cat([attn, ffn]).mean().detach())
    stats = SimpleNamespace(kinds=["attn", "ffn"], skip_grad={"attn": attn, "ffn": ffn},
                            realized=lambda kind=None, differentiable=False: mean)
    loss, logs = task.sparsity_loss(stats)
    over = (0.9 - 0.7) + (0.75 - 0.7)
    assert abs(logs["over_cap"].item() - over) < 1e-6
    assert abs(loss.item() - 2.0 * (abs(0.5 - mean.item()) + over)) < 1e-6
    loss.backward()
    assert attn.grad.tolist() == [0.0, 2.0] and ffn.grad.tolist() == [2.0, 0.0]
    uncapped = RouterCalibration(model=tiny_model_dir, routing=cfg, lam=2.0)
    _, logs = uncapped.sparsity_loss(stats)
    assert "over_cap" not in logs


def test_layer_cap_in_training_lowers_the_highest_layer_rate(tiny_model_dir):
    """On a real routed forward the capped loss differs from the uncapped one by exactly the overshoot of the
    stats' per-layer rates."""
    from wide.tasks import RouterCalibration

    cfg = wide.WideConfig(sparsity=0.5, ffn_group_size=32, sparsity_measure="weight")
    model = wide.apply_wide(tiny_model("llama"), cfg).train()
    model(torch.randint(3, 96, (2, 8)))
    stats = wide.sparsity_stats(model)
    cap = 0.55
    capped = RouterCalibration(model=tiny_model_dir, routing=cfg, lam=1.0, layer_cap=cap).sparsity_loss(stats)[0]
    plain = RouterCalibration(model=tiny_model_dir, routing=cfg, lam=1.0).sparsity_loss(stats)[0]
    rates = torch.cat([stats.skip[k] for k in stats.kinds])
    assert torch.allclose(capped - plain, (rates - cap).clamp_min(0).sum())


@pytest.mark.parametrize("cap,match", [(0.0, "in \\(0, 1\\]"), (1.5, "in \\(0, 1\\]"), (True, "layer_cap"),
                                       ("0.8", "layer_cap"), (0.4, "below the sparsity target")])
def test_layer_cap_checked_before_anything_loads(cap, match, tiny_model_dir):
    from wide.tasks import RouterCalibration

    with pytest.raises(ValueError, match=match):
        RouterCalibration(model=tiny_model_dir, routing=wide.WideConfig(sparsity=0.5, ffn_group_size=32),
                          layer_cap=cap)


@pytest.mark.parametrize("value", [1, "", 0.5, None])
def test_fuse_glue_checked_before_anything_loads(value, tiny_model_dir):
    from wide.tasks import RouterCalibration

    with pytest.raises(ValueError, match="fuse_glue"):
        RouterCalibration(model=tiny_model_dir, routing=wide.WideConfig(sparsity=0.5, ffn_group_size=32),
                          fuse_glue=value)


def test_fuse_glue_compiles_the_built_models_glue(tiny_model_dir):
    """``fuse_glue``: the task's model has its norms, RoPE and routed MLP glue compiled (the values: tests/modeling/
    test_fuse.py); a LoRA stage's too, around peft's wrapped projections."""
    import torch._dynamo

    from wide.modeling.fuse import unfuse_glue
    from wide.tasks import LoRARecovery, RouterCalibration

    cfg = wide.WideConfig(sparsity=0.5, ffn_group_size=32)
    torch._dynamo.reset()
    for task in (RouterCalibration(model=tiny_model_dir, routing=cfg, fuse_glue="aot_eager"),
                 LoRARecovery(model=tiny_model_dir, routing=cfg, fuse_glue="aot_eager")):
        task.configure_model()
        try:
            mlps = [layer.mlp for layer in task.model.get_decoder().layers]
            # Lightning switches modes at every validation: transformers' hub-kernel re-kernelization on a mode
            # switch (on by default where `kernels` is installed) must not put the eager forwards back
            task.model.eval()
            task.model.train()
            assert not getattr(task.model, "use_kernels", False)
            assert all(hasattr(m.forward, "_wide_original") for m in mlps)
            assert hasattr(task.model.get_decoder().norm.forward, "_wide_original")
            ids = torch.randint(3, 96, (2, 8))
            task.model.train()
            task.model(input_ids=ids, labels=ids).loss.backward()
        finally:
            unfuse_glue(task.model)
    torch._dynamo.reset()


def _optimizer_groups(task):
    from types import SimpleNamespace

    task._trainer = SimpleNamespace(estimated_stepping_batches=10)
    out = task.configure_optimizers()
    names = {id(p): n for n, p in task.model.named_parameters()}
    return out["optimizer"], [(g["initial_lr"], g["weight_decay"], [names[id(p)] for p in g["params"]])
                              for g in out["optimizer"].param_groups]


def test_router_lr_gives_the_routers_their_own_learning_rate(tiny_model_dir):
    """``router_lr``: a stage-2 (LoRA) task trains its routers at their own peak rate and LoRA at ``lr``, each split
    into decayed matrices and undecayed vectors; the schedule scales both the same way."""
    from wide.tasks import LoRARecovery

    cfg = wide.WideConfig(sparsity=0.5, attn_group_size=2, ffn_group_size=32)
    task = LoRARecovery(model=tiny_model_dir, routing=cfg, lora_r=4, lr=2e-4, router_lr=2e-3, weight_decay=0.01)
    task.configure_model()
    opt, groups = _optimizer_groups(task)
    trained = {n for n, p in task.model.named_parameters() if p.requires_grad}
    assert {n for *_, ns in groups for n in ns} == trained and sum(len(ns) for *_, ns in groups) == len(trained)
    for lr, wd, ns in groups:
        routers = [is_router_name(n) for n in ns]
        assert all(routers) if lr == 2e-3 else not any(routers)
        assert lr in (2e-4, 2e-3) and wd in (0.0, 0.01)
    assert any(lr == 2e-3 and ns for lr, _, ns in groups) and any(lr == 2e-4 and ns for lr, _, ns in groups)
    assert any("lora_A" in n for lr, _, ns in groups if lr == 2e-4 for n in ns)


def test_without_router_lr_the_optimizer_keeps_its_two_groups(tiny_model_dir):
    """No ``router_lr``: one learning rate and the two groups (decayed, undecayed) that resume checkpoints written
    before the option hold."""
    from wide.tasks import RouterCalibration

    task = RouterCalibration(model=tiny_model_dir, routing=wide.WideConfig(sparsity=0.5, ffn_group_size=32), lr=1e-3)
    task.configure_model()
    opt, groups = _optimizer_groups(task)
    assert [(lr, wd) for lr, wd, _ in groups] == [(1e-3, task.weight_decay), (1e-3, 0.0)]


@pytest.mark.parametrize("value", [0, -1e-3, True, "2e-3"])
def test_router_lr_checked_before_anything_loads(value, tiny_model_dir):
    from wide.tasks import LoRARecovery

    with pytest.raises(ValueError, match="router_lr"):
        LoRARecovery(model=tiny_model_dir, routing=wide.WideConfig(sparsity=0.5, ffn_group_size=32), router_lr=value)
