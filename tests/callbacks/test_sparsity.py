"""SparsityMonitor logs means over data-parallel ranks with a single all-reduce per log step."""

import torch

import wide
from tests.conftest import tiny_model
from wide.callbacks import SparsityMonitor


class _Strategy:
    def __init__(self):
        self.calls = []

    def reduce(self, values, reduce_op):
        self.calls.append((values.shape, reduce_op))
        return torch.full_like(values, 0.25)


class _Trainer:
    world_size = 2

    def __init__(self):
        self.strategy = _Strategy()


class _Module:
    def __init__(self):
        self.logged = {}

    def log(self, name, value, **kwargs):
        self.logged[name] = float(value)


def test_train_rates_are_reduced_in_one_call():
    model = wide.apply_wide(tiny_model("llama"), wide.WideConfig(attn_group_size=2, ffn_group_size=32)).train()
    model(torch.randint(3, 96, (2, 8)))
    trainer, module = _Trainer(), _Module()
    SparsityMonitor()._log_rates(trainer, module, wide.sparsity_stats(model), "train", 2)
    n = 2 + 2 * (1 + 3)  # total and by weight, then per kind: the mean and 3 layers
    assert trainer.strategy.calls == [((n,), "mean")]
    assert len(module.logged) == n and set(module.logged.values()) == {0.25}
    assert "sparsity/train/ffn/layer_02" in module.logged and "sparsity/train/by_weight" in module.logged


def test_validation_logs_the_by_weight_rate_beside_the_kinds():
    model = wide.apply_wide(tiny_model("llama"), wide.WideConfig(attn_group_size=2, ffn_group_size=32)).eval()
    trainer, module = _Trainer(), _Module()
    trainer.sanity_checking = False
    module.model, module.device = model, torch.device("cpu")
    monitor = SparsityMonitor(log_per_layer=False)
    batch = {"input_ids": torch.randint(3, 96, (2, 8))}
    with torch.no_grad():
        model(**batch)
    stats = wide.sparsity_stats(model)
    monitor.on_validation_batch_end(trainer, module, None, batch, 0)
    monitor.on_validation_epoch_end(trainer, module)
    logged = module.logged
    assert abs(logged["sparsity/val/total"] - float(stats.realized())) < 1e-6  # the kinds only, not by_weight
    assert abs(logged["sparsity/val/by_weight"] - float(stats.realized_by_weight())) < 1e-6
