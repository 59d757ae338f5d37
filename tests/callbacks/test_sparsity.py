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
    n = 1 + 2 * (1 + 3)  # total, then per kind: the mean and 3 layers
    assert trainer.strategy.calls == [((n,), "mean")]
    assert len(module.logged) == n and set(module.logged.values()) == {0.25}
    assert "sparsity/train/ffn/layer_02" in module.logged
