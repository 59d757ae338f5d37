"""`wide.modeling.fit_rate`: after a short stage-1 calibration the noise-free (eval) rate lands on the target."""

import pytest
import torch

import wide
from tests.conftest import tiny_model
from wide.modeling.rate import fit_rate, measure_rates, target_rates
from wide.policies.base import gumbel_ste


def _batches(n: int, seed: int, rows: int = 8, tokens: int = 32) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(3, 96, (rows, tokens), generator=gen)} for _ in range(n)]


def _calibrated(cfg: wide.WideConfig, steps: int = 40, layers: int = 6):
    """A tiny Llama whose routers trained ``steps`` stage-1 steps (LM + 20 |target - rate|, tau 5 -> 0.5)."""
    torch.manual_seed(0)
    model = wide.apply_wide(tiny_model("llama", num_hidden_layers=layers), cfg)
    for name, p in model.named_parameters():
        p.requires_grad_(".wide.routers." in f".{name}")
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-2)
    data = _batches(8, seed=1)
    model.train()
    for step in range(steps):
        wide.set_temperature(model, 5.0 - 4.5 * step / (steps - 1))
        ids = data[step % len(data)]["input_ids"]
        loss = model(input_ids=ids, labels=ids).loss
        rates = target_rates(wide.sparsity_stats(model), cfg, differentiable=True)
        loss = loss + 20 * sum((t - r).abs() for t, r in rates.values())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


def _rate(model, batches, cfg) -> float:
    model.eval()
    return measure_rates(model, batches, cfg)[0]["all"][1]


def test_hard_gumbel_samples_skip_at_the_sigmoid_of_the_margin_whatever_the_temperature():
    """The cause: a hard sample executes with probability sigmoid(margin) at any temperature, so training meets a
    0.4 target with every margin at +0.4, where the eval argmax skips nothing."""
    logits = torch.tensor([0.4, 0.0]).expand(200_000, 2)
    for tau in (5.0, 0.5):
        skipped = 1 - gumbel_ste(logits, tau).mean().item()
        assert abs(skipped - torch.sigmoid(torch.tensor(-0.4)).item()) < 0.005, tau  # 0.401
    assert not (logits[:, 0] < logits[:, 1]).any()  # the eval decision: no skip at all


@pytest.mark.parametrize("target", [0.25, 0.6])
@pytest.mark.parametrize(("router", "granularity"), [("lowrank", "width"), ("static", "width"), ("lowrank", "layer")],
                         ids=["lowrank", "static", "layer"])
def test_after_a_short_calibration_the_noise_free_rate_lands_on_the_target(router, granularity, target):
    cfg = wide.WideConfig(sparsity=target, sparsity_measure="weight", router=router, granularity=granularity,
                          attn_group_size=1, ffn_group_size=16)
    model = _calibrated(cfg)
    calib, held_out = _batches(16, seed=2), _batches(16, seed=3)  # 4096 tokens each
    fit = fit_rate(model, calib, cfg)
    if router == "static":  # the trained rate is the sigmoid mean: every group on one side of the threshold
        assert abs(fit.before["all"] - target) > 0.2, fit.describe()
    assert fit.targets == {"all": target} and fit.fixed == 0
    assert fit.routers == 6 * (1 if granularity == "layer" else 2)
    assert model.training, "left in the mode it came in"
    assert abs(fit.after["all"] - target) <= 0.01, fit.describe()  # a static router moves in whole groups
    assert abs(_rate(model, calib, cfg) - fit.after["all"]) < 1e-6  # what it reports is what the model now does
    assert abs(_rate(model, held_out, cfg) - target) <= 0.02, fit.describe()


def test_a_model_on_target_is_left_unchanged():
    model = wide.apply_wide(tiny_model("llama"), wide.WideConfig(attn_group_size=2, ffn_group_size=32)).train()
    batches = _batches(2, seed=4)
    rate = _rate(model, batches, wide.WideConfig(attn_group_size=2, ffn_group_size=32, sparsity_measure="weight"))
    cfg = wide.WideConfig(sparsity=rate, attn_group_size=2, ffn_group_size=32, sparsity_measure="weight")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.train()
    fit = fit_rate(model, batches, cfg)
    assert fit.passes == 1 and fit.shifts == {"all": 0.0} and fit.after == fit.before
    assert model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_per_kind_targets_shift_each_kind_to_its_own():
    cfg = wide.WideConfig(attn_sparsity=0.3, ffn_sparsity=0.55, attn_group_size=1, ffn_group_size=16)
    model = wide.apply_wide(tiny_model("llama", num_hidden_layers=4), cfg)  # untrained: margins around 0
    fit = fit_rate(model, _batches(4, seed=5), cfg, tolerance=0.002)
    assert fit.targets == {"attn": 0.3, "ffn": 0.55} and fit.measure == "per router kind"
    assert all(abs(fit.after[k] - t) <= 0.005 for k, t in fit.targets.items()), fit.describe()
    assert fit.shifts["attn"] != fit.shifts["ffn"]
    assert {"rate_fit/after/attn", "rate_fit/before/ffn", "rate_fit/shift/ffn"} <= fit.metrics().keys()


def test_routers_without_a_threshold_are_left_alone():
    model = wide.apply_wide(tiny_model("llama"), wide.WideConfig(router="topk", attn_group_size=2, ffn_group_size=32))
    assert fit_rate(model, _batches(1, seed=6), model.wide_config) is None


def test_every_pass_reduces_its_sums_once_over_ranks():
    """Data-parallel ranks measure their own batches and shift by the same amount: one all-reduce (sum) per pass
    of ``[rate x tokens ..., tokens]``. Here a second rank holds the same batches, so the rates stay."""
    cfg = wide.WideConfig(sparsity=0.35, attn_group_size=2, ffn_group_size=32, sparsity_measure="weight")
    model = wide.apply_wide(tiny_model("llama"), cfg)
    calls = []

    def reduce(sums):
        calls.append(sums.shape)
        return sums * 2

    fit = fit_rate(model, _batches(2, seed=7), cfg, reduce=reduce)
    assert calls == [(2,)] * fit.passes and fit.tokens == 2 * 2 * 8 * 32
    assert abs(fit.after["all"] - 0.35) <= 0.002
    assert "by routed weight" in fit.describe() and "0.3500" in fit.describe()
