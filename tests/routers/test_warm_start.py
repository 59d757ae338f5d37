"""`wide.routers.warm_start`: routers fitted to the dense model's per-token group importance before stage 1."""

import json
from pathlib import Path

import pytest
import torch

import wide
from tests.conftest import tiny_model
from wide.routers import warm_start as ws
from wide.routers.base import rms_normalize


def _routed(router="lowrank", rank=8, **cfg):
    model = tiny_model("llama", num_hidden_layers=2)
    return wide.apply_wide(model, wide.WideConfig(sparsity=0.5, granularity=cfg.pop("granularity", "width"),
                                                  attn_group_size=2, ffn_group_size=16, router=router,
                                                  router_rank=rank, **cfg))


def _batches(n=3, B=2, T=24, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(3, 96, (B, T), generator=gen)} for _ in range(n)]


def test_solve_recovers_an_exact_linear_map():
    """With log contributions exactly linear in the input, the fit is that map (intercept included) over the
    targets' spread, with R² 1, from statistics streamed over two batches."""
    gen = torch.Generator().manual_seed(0)
    D, G, N = 12, 5, 4000
    x = torch.randn(N, D, generator=gen)
    a, c = torch.randn(D, G, generator=gen), torch.randn(G, generator=gen)
    y = x @ a + c
    s = ws._Stats(D, G)
    s.add(x[:1500], y[:1500])
    s.add(x[1500:], y[1500:])  # streamed
    fit = ws.solve(s, ridge=1e-9)
    spread = float(y.flatten().std(unbiased=False))
    assert fit.r2 > 0.999 and fit.tokens == N
    torch.testing.assert_close(fit.weight * spread, a, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(fit.bias * spread, c, atol=1e-3, rtol=1e-3)


def test_the_threshold_histogram_is_exact_to_a_bin_and_clamps_its_range():
    y = torch.tensor([-30.0, -1.0, 0.0, 0.5, 1.0, 25.0])
    h = ws.histogram(y)
    assert float(h.sum()) == 6 and float(h[0]) == 1 and float(h[-1]) == 1  # out of range: the end bins
    assert abs(ws.quantile(h, 0.5) - 0.0) < 0.01
    z = torch.randn(20000, generator=torch.Generator().manual_seed(1))
    assert abs(ws.quantile(ws.histogram(z), 0.3) - float(torch.quantile(z, 0.3))) < 0.01
    assert ws.quantile(torch.zeros(ws.BINS), 0.5) == 0.0


@pytest.mark.parametrize("router,rank", [("linear", 8), ("lowrank", 16), ("lowrank", 2)])
def test_warm_start_writes_the_fit_into_each_router(router, rank):
    """Every router's execute margins become the fitted map of its normalised input (exactly for a linear router
    or a rank that holds the map; the best rank-r part otherwise), positively tied to the real contributions; the
    model is left as it was (no hooks, no patched methods)."""
    model = _routed(router, rank)
    rt = wide.modeling.runtime_of(model)
    before = {(wl.layer_idx, k): {n: p.clone() for n, p in r.named_parameters()}
              for wl in rt.layers for k, r in wl.routers.items()}
    hooks = sum(len(m._forward_pre_hooks) for m in model.modules())
    fits = ws.warm_start(model, _batches(), max_tokens=10_000)
    assert set(fits) == set(before) and all(0.0 <= f.r2 <= 1.0 for f in fits.values())
    assert all(f.tokens == 3 * 2 * 24 for f in fits.values())
    assert sum(len(m._forward_pre_hooks) for m in model.modules()) == hooks
    x = torch.randn(2, 7, 64)
    for wl in rt.layers:
        assert "_decide" not in wl.__dict__
        for kind, r in wl.routers.items():
            fit = fits[(wl.layer_idx, kind)]
            assert any(not torch.equal(p, before[(wl.layer_idx, kind)][n]) for n, p in r.named_parameters())
            want = rms_normalize(x) @ fit.weight + fit.bias
            got = r.execute_margin(x)
            if router == "linear" or rank >= r.num_groups:
                torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
            else:  # rank-2 part of the map: closer to it than the random start was
                assert (got - want).pow(2).mean() < want.pow(2).mean()


def test_margins_rank_tokens_by_their_real_contribution():
    """On the data it was fitted to, a warm-started router's margin correlates with the group's real log
    contribution (what a random router's does not)."""
    model = _routed("linear")
    batches = _batches(n=4, T=32)
    stats = ws.collect(model, batches, max_tokens=10_000)
    ws.warm_start(model, batches, max_tokens=10_000)
    rt = wide.modeling.runtime_of(model)
    # replay: the contributions and inputs of layer 1's FFN, against its margins
    pairs = {}

    def grab(wl):
        def decide(kind, residual):  # record the margins, run every group (the dense contributions)
            g = wl.slots[kind].num_groups
            pairs.setdefault(kind, []).append(wl.routers[kind].execute_margin(residual).reshape(-1, g))
            return torch.ones(*residual.shape[:2], g)
        return decide

    wl = rt.layers[1]
    wl._decide = grab(wl)
    ffn_in = []
    down = model.model.layers[1].mlp.down_proj
    h = down.register_forward_pre_hook(lambda m, a: ffn_in.append(a[0].reshape(-1, a[0].shape[-1])))
    with torch.no_grad():
        for b in batches:
            model(**b)
    h.remove()
    del wl._decide
    margin = torch.cat(pairs["ffn"])
    contrib = torch.log(ws._contributions(torch.cat(ffn_in), down.weight, 16) + 1e-8)
    corr = torch.corrcoef(torch.stack([margin.flatten(), contrib.flatten()]))[0, 1]
    assert stats[(1, "ffn")].n > 0 and corr > 0.2


def test_unsupported_routers_and_policies_are_named():
    with pytest.raises(ValueError, match="router_init.*MLPRouter"):
        ws.check_supported(_routed("mlp"))
    with pytest.raises(ValueError, match="router_init.*width routing"):
        ws.check_supported(_routed("lowrank", granularity="layer"))


def test_a_fit_warm_starts_its_routers_and_a_resume_does_not(tmp_path, tiny_model_dir, tiny_corpus, capsys):
    """``router_init: importance`` fits the routers before the first step (logged), so its first step starts from
    other routers than ``random``; a resume keeps the trained ones."""
    from safetensors.torch import load_file

    from tests.reliability.conftest import fit_args, run_wide

    steps = ["--trainer.max_steps", "2", "--trainer.val_check_interval", "2", "--trainer.limit_val_batches", "1",
             "--sparsity_monitor.heatmap_every_n_steps", "0", "--rate_calibration.enabled", "false"]
    warm = ["--model.init_args.router_init", "importance", "--model.init_args.router_init_tokens", "128"]
    rc, err = run_wide(fit_args(tmp_path / "warm", tiny_model_dir, tiny_corpus, *steps, *warm), capsys)
    assert rc == 0, err[-3000:]
    assert "wide: routers warm-started from group importance over 128 tokens (variance explained" in err
    rc, err = run_wide(fit_args(tmp_path / "cold", tiny_model_dir, tiny_corpus, *steps), capsys)
    assert rc == 0 and "warm-started" not in err
    a, b = (load_file(tmp_path / d / "wide/routers.safetensors") for d in ("warm", "cold"))
    assert a.keys() == b.keys() and any(not torch.equal(a[k], b[k]) for k in a)
    more = ["--trainer.max_steps", "4", "--ckpt_path", "last"]
    rc, err = run_wide(fit_args(tmp_path / "warm", tiny_model_dir, tiny_corpus, *steps, *warm, *more), capsys)
    assert rc == 0, err[-3000:]
    assert "warm-started" not in err


@pytest.mark.parametrize("args,match", [
    (dict(router_init="zeros"), "router_init: must be one of random, importance"),
    (dict(router_init_tokens=0), "router_init_tokens: must be a positive integer"),
    (dict(router_init="importance", routing=wide.WideConfig(router="mlp")), "router_init: 'importance' fits.*set router_init: random"),
    (dict(router_init="importance", routing=wide.WideConfig(granularity="layer")), "routing.granularity 'width'"),
])
def test_bad_router_init_settings_are_named_before_anything_loads(args, match, tiny_model_dir):
    from wide.tasks import RouterCalibration

    with pytest.raises(ValueError, match=match):
        RouterCalibration(model=tiny_model_dir, **args)


def test_importance_init_refuses_fsdp2_before_anything_loads(tiny_model_dir):
    from types import SimpleNamespace

    from wide.distributed import FSDP2Strategy
    from wide.tasks import RouterCalibration
    from wide.tasks.checks import preflight

    task = RouterCalibration(model=tiny_model_dir, router_init="importance")
    with pytest.raises(ValueError, match="router_init: 'importance' writes whole router weights, which FSDP2"):
        preflight(task, None, SimpleNamespace(strategy=FSDP2Strategy()))
    preflight(RouterCalibration(model=tiny_model_dir), None, SimpleNamespace(strategy=FSDP2Strategy()))


def test_no_batches_is_an_error_naming_router_init():
    with pytest.raises(ValueError, match="router_init: 'importance' read no training tokens"):
        ws.warm_start(_routed(), [], max_tokens=100)


def test_padded_rows_are_left_out_of_the_statistics():
    """Tokens an attention mask marks as padding add nothing: a padded batch gives the statistics of its real
    tokens alone."""
    model = _routed("linear")
    ids = torch.randint(3, 96, (2, 16), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 10:] = 0
    stats = ws.collect(model, [{"input_ids": ids, "attention_mask": mask}], max_tokens=1000)
    assert all(s.n == 26 for s in stats.values())
    hists = ws.margin_histograms(model, [{"input_ids": ids, "attention_mask": mask}])
    assert all(float(h.sum()) == 26 * stats[key].g for key, h in hists.items())


@pytest.mark.parametrize("router,rank", [("linear", 8), ("lowrank", 2)])
def test_each_router_starts_at_its_target_rate_on_the_data_it_was_fitted_to(router, rank):
    """The second pass puts every router's threshold at its target share of its own margins."""
    model = _routed(router, rank)
    batches = _batches(n=2, T=32)
    ws.warm_start(model, batches, max_tokens=10_000)
    hists = ws.margin_histograms(model, batches)
    for key, h in hists.items():
        below = float(h[: ws.BINS // 2].sum() / h.sum())  # margins under 0: skipped
        assert abs(below - 0.5) < 0.02, (key, below)


def test_a_joint_fit_warm_starts_its_routers_and_resumes_without_it(tmp_path, tiny_model_dir, tiny_corpus, capsys):
    """Stage 2 without a router checkpoint (routers and LoRA together, the joint recipe's kind) takes
    ``router_init: importance`` as stage 1 does: the routers are fitted before the first step (LoRA's B is zero then,
    so they see the dense model), and a resume keeps the trained ones."""
    from safetensors.torch import load_file

    from tests.reliability.conftest import fit_args, run_wide

    recipe = Path(__file__).resolve().parents[2] / "recipes/smollm2-135m/lora_distill.yaml"
    routing = ["--model.init_args.router_checkpoint", "null", "--model.init_args.routing",
               json.dumps({"sparsity": 0.5, "attn_group_size": 2, "ffn_group_size": 32})]
    steps = ["--trainer.max_steps", "2", "--trainer.val_check_interval", "2", "--trainer.limit_val_batches", "1",
             "--sparsity_monitor.heatmap_every_n_steps", "0", "--rate_calibration.enabled", "false"]
    warm = ["--model.init_args.router_init", "importance", "--model.init_args.router_init_tokens", "128"]
    rc, err = run_wide(fit_args(tmp_path / "warm", tiny_model_dir, tiny_corpus, *routing, *steps, *warm,
                                recipe=recipe), capsys)
    assert rc == 0, err[-3000:]
    assert "wide: routers warm-started from group importance over 128 tokens (variance explained" in err
    rc, err = run_wide(fit_args(tmp_path / "cold", tiny_model_dir, tiny_corpus, *routing, *steps, recipe=recipe), capsys)
    assert rc == 0 and "warm-started" not in err
    a, b = (load_file(tmp_path / d / "wide/routers.safetensors") for d in ("warm", "cold"))
    routers = [k for k in a if ".wide.routers." in k]
    assert routers and any(not torch.equal(a[k], b[k]) for k in routers)
    more = ["--trainer.max_steps", "4", "--ckpt_path", "last"]
    rc, err = run_wide(fit_args(tmp_path / "warm", tiny_model_dir, tiny_corpus, *routing, *steps, *warm, *more,
                                recipe=recipe), capsys)
    assert rc == 0, err[-3000:]
    assert "warm-started" not in err


def test_stage_2_router_init_is_refused_beside_a_router_checkpoint(tmp_path, tiny_model_dir):
    """A stage 2 that loads its routers has nothing to warm-start: one error naming router_init, before any load."""
    from transformers import AutoModelForCausalLM

    from wide.io.checkpoint import save_trained
    from wide.tasks import LoRARecovery

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    cfg = wide.WideConfig(sparsity=0.5, attn_group_size=2, ffn_group_size=32)
    wide.apply_wide(model, cfg)
    ckpt = save_trained(model, tmp_path / "routers.safetensors", config=cfg, stage="calibrate")
    with pytest.raises(ValueError, match="router_init: 'importance' starts routers without a checkpoint"):
        LoRARecovery(model=tiny_model_dir, router_checkpoint=str(ckpt), router_init="importance")
    with pytest.raises(ValueError, match="router_init: must be one of random, importance"):
        LoRARecovery(model=tiny_model_dir, router_init="zeros")
    with pytest.raises(ValueError, match="router_init: 'importance' fits.*set router_init: random"):
        LoRARecovery(model=tiny_model_dir, routing=wide.WideConfig(router="mlp"), router_init="importance")
