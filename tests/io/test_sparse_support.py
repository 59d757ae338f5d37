"""The sparse adapters' support: the top Wanda (|W| x input-channel L2 norm) or magnitude entries, checked against
a direct computation entry by entry."""

import pytest
import torch
from torch import nn

from wide.io.adapters import ADAPTERS
from wide.io.adapters.super import shira_layers, top_support, wanda_scores


def _direct_top(weight, norms, k):
    """The k (row, column) pairs of the largest |w_ij| * norm_j, by a plain loop over every entry."""
    scores = [(abs(float(weight[i, j])) * float(norms[j]), i, j)
              for i in range(weight.shape[0]) for j in range(weight.shape[1])]
    return sorted((i, j) for _, i, j in sorted(scores, reverse=True)[:k])


def _pairs(idx):
    return sorted(zip(idx[0].tolist(), idx[1].tolist()))


def test_top_support_is_row_major_positions_of_the_largest_scores():
    scores = torch.tensor([[0.1, 9.0, 0.3], [5.0, 0.2, 7.0]])
    idx = top_support(scores, 3)
    assert idx.dtype == torch.int32 and idx.tolist() == [[0, 1, 1], [1, 0, 2]]
    weight = torch.tensor([[1.0, -2.0, 3.0], [4.0, 5.0, -6.0]])
    norms = torch.tensor([10.0, 1.0, 0.1])  # the small weights of channel 0 win on their large inputs
    assert _pairs(top_support(wanda_scores(weight, norms), 2)) == [(0, 0), (1, 0)]
    assert _pairs(top_support(weight.abs(), 2)) == [(1, 1), (1, 2)]


class Toy(nn.Module):
    """One linear layer fed ``input_ids`` as activations: what a calibration pass sees, without a language model."""

    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(16, 4, bias=False)

    def forward(self, input_ids, attention_mask=None):
        return self.q_proj(input_ids)


@pytest.mark.parametrize("name", ["super", "supra"])
def test_wanda_calibration_picks_the_top_entries_measured_directly(name):
    torch.manual_seed(0)
    model = Toy()
    kind = ADAPTERS.get(name)()
    settings = kind.settings(r=2, alpha=8.0, dropout=0.0, targets=["q_proj"], score="wanda")
    weight = model.q_proj.weight.detach().clone()
    kind.inject(model, settings)
    layer = shira_layers(model)["q_proj" if name == "super" else "q_proj.base_layer"]
    k = layer.shira_weight["default"].numel()
    assert k == (2 if name == "super" else 1) * (16 + 4)
    assert _pairs(layer.shira_indices["default"]) == _direct_top(weight, torch.ones(16), k)  # magnitude at first
    scale = 10.0 ** (torch.arange(16) % 4 - 2.0)  # input channels of very different sizes
    batches = [{"input_ids": torch.randn(3, 5, 16) * scale, "attention_mask": torch.ones(3, 5, dtype=torch.long)}
               for _ in range(2)]
    batches[1]["attention_mask"][:, -2:] = 0  # padding: its activations must not count
    batches[1]["input_ids"][:, -2:] = 1e4
    kind.calibrate(model, batches, settings)
    x = torch.cat([batches[0]["input_ids"].reshape(-1, 16), batches[1]["input_ids"][:, :-2].reshape(-1, 16)])
    norms = x.pow(2).sum(0).sqrt()
    chosen = _pairs(layer.shira_indices["default"])
    assert chosen == _direct_top(weight, norms, k)
    assert chosen != _direct_top(weight, torch.ones(16), k)  # the activations changed the support


def test_magnitude_support_needs_no_data_and_calibration_keeps_it():
    torch.manual_seed(1)
    model = Toy()
    kind = ADAPTERS.get("super")()
    settings = kind.settings(r=1, alpha=8.0, dropout=0.0, targets=["q_proj"], score="magnitude")
    weight = model.q_proj.weight.detach().clone()
    kind.inject(model, settings)
    assert not kind.needs_calibration(settings) and kind.calibrate(model, iter(()), settings) == ""
    assert _pairs(shira_layers(model)["q_proj"].shira_indices["default"]) == _direct_top(weight, torch.ones(16), 20)


def test_calibration_refuses_a_support_that_already_trained():
    model = Toy()
    kind = ADAPTERS.get("super")()
    settings = kind.settings(r=1, alpha=8.0, dropout=0.0, targets=["q_proj"])
    kind.inject(model, settings)
    with torch.no_grad():
        shira_layers(model)["q_proj"].shira_weight["default"].fill_(0.1)
    with pytest.raises(ValueError, match="q_proj already holds trained sparse values"):
        kind.calibrate(model, [{"input_ids": torch.randn(2, 3, 16)}], settings)
