import torch

import wide
from tests.conftest import tiny_model


def _force(model, kind, mask):
    for layer in model.model.layers:
        layer.wide.forced[kind] = mask


def test_accounting_matches_hand_count_with_padding():
    model = tiny_model("llama", num_hidden_layers=2)
    wide.apply_wide(model, wide.WideConfig(attn_group_size=2, ffn_group_size=32))  # 4 attn groups, 4 ffn groups
    attn = torch.tensor([[[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]],
                         [[1, 0, 0, 0], [9, 9, 9, 9], [1, 1, 1, 0]]], dtype=torch.float32)
    attn[1, 1] = 0  # padded position: whatever its mask, it must not count
    ffn = torch.ones(2, 3, 4)
    ffn[0, 0] = 0
    _force(model, "attn", attn)
    _force(model, "ffn", ffn)
    ids = torch.randint(3, 96, (2, 3))
    am = torch.tensor([[1, 1, 1], [1, 0, 1]])
    model(ids, attention_mask=am)
    stats = wide.sparsity_stats(model)
    # valid (token, group) units: 5 tokens x 4 groups = 20; attn skipped: 2 + 0 + 4 + 3 + 1 = 10
    assert torch.allclose(stats.skip["attn"], torch.tensor([0.5, 0.5]))
    assert torch.allclose(stats.skip["ffn"], torch.tensor([4 / 20, 4 / 20]))
    assert torch.allclose(stats.realized(), torch.tensor((0.5 + 0.2) / 2))
    # by weight: each kind's routed weight elements, counted from the modules themselves (k/v stay dense)
    layer = model.model.layers[0]
    n_attn = layer.self_attn.q_proj.weight.numel() + layer.self_attn.o_proj.weight.numel()
    n_ffn = sum(getattr(layer.mlp, p).weight.numel() for p in ("gate_proj", "up_proj", "down_proj"))
    assert stats.weights["attn"].tolist() == [n_attn] * 2 and stats.weights["ffn"].tolist() == [n_ffn] * 2
    assert torch.allclose(stats.realized_by_weight(), torch.tensor((0.5 * n_attn + 0.2 * n_ffn) / (n_attn + n_ffn)))
    assert wide.sparsity_stats(model).weights is stats.weights  # made once: no host-to-device copy per step
    assert stats.token_active["attn"].shape == (2, 3, 2)
    assert torch.allclose(stats.token_active["attn"][0, :, 0], torch.tensor([0.5, 1.0, 0.0]))
    assert torch.equal(stats.valid, am.bool())


def test_forced_all_off_attention_passes_residual():
    """Layer policy with every token skipped: the model reduces to embeddings -> final norm -> head."""
    model = tiny_model("llama", num_hidden_layers=2)
    wide.apply_wide(model, wide.WideConfig(granularity="layer"))
    _force(model, "layer", torch.zeros(1, 4, 1))
    ids = torch.randint(3, 96, (1, 4))
    out = model(ids).logits
    ref = model.lm_head(model.model.norm(model.model.embed_tokens(ids)))
    assert torch.allclose(out, ref, atol=1e-6)
    assert wide.sparsity_stats(model).realized().item() == 1.0


def test_accounting_is_computed_when_read_from_the_masks_of_the_last_forward():
    """record() only keeps the masks: a forward nobody reads launches no accounting work, and stats read
    after a CUDA-graph replay see the masks that replay wrote into the captured buffers."""
    model = tiny_model("llama", num_hidden_layers=2)
    wide.apply_wide(model, wide.WideConfig(attn_group_size=2, ffn_group_size=32))
    model.eval()
    model(torch.randint(3, 96, (2, 5)))
    runtime = wide.modeling.runtime_of(model)
    mask, _ = runtime._records[(0, "ffn")]
    assert mask.shape == (2, 5, 4)
    mask.fill_(0.0)  # what a replay writes into the same buffer
    assert wide.sparsity_stats(model).skip["ffn"][0].item() == 1.0
    mask.fill_(1.0)
    assert wide.sparsity_stats(model).skip["ffn"][0].item() == 0.0
