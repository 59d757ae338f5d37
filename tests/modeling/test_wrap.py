import pytest
import torch

import wide
from tests.conftest import tiny_model
from wide.routers import Router


class AlwaysExecute(Router):
    def forward(self, hidden):
        logits = torch.zeros(*hidden.shape[:-1], self.num_groups, 2, device=hidden.device)
        logits[..., 0] = 1.0
        return logits


def test_all_execute_reproduces_unwrapped_logits(arch):
    model = tiny_model(arch)
    ids = torch.randint(3, 96, (2, 12))
    ref = model(ids).logits
    wide.apply_wide(model, wide.WideConfig(sparsity=0.5, attn_group_size=2, ffn_group_size=32, router=AlwaysExecute))
    out = model(ids).logits
    assert torch.equal(out, ref)
    stats = wide.sparsity_stats(model)
    assert stats.realized().item() == 0.0


@pytest.mark.parametrize("group", [1, 2, 4, 8])
def test_forward_and_generate(arch, group):
    model = tiny_model(arch)
    wide.apply_wide(model, wide.WideConfig(sparsity=0.5, attn_group_size=group, ffn_group_size=32))
    ids = torch.randint(3, 96, (2, 9))
    out = model(ids).logits
    assert out.shape == (2, 9, 96) and torch.isfinite(out).all()
    gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False)
    assert gen.shape == (2, 17)


def test_greedy_with_cache_equals_without(arch):
    model = tiny_model(arch)
    wide.apply_wide(model, wide.WideConfig(sparsity=0.5, attn_group_size=2, ffn_group_size=32))
    ids = torch.randint(3, 96, (2, 10))
    am = torch.ones_like(ids)
    a = model.generate(ids, attention_mask=am, max_new_tokens=8, do_sample=False)
    b = model.generate(ids, attention_mask=am, max_new_tokens=8, do_sample=False, use_cache=False)
    assert torch.equal(a, b)


def test_generate_with_left_padding_and_sampling():
    model = tiny_model("llama")
    wide.apply_wide(model, wide.WideConfig(sparsity=0.5, ffn_group_size=32))
    ids = torch.randint(3, 96, (2, 10))
    am = torch.ones_like(ids)
    ids[0, :4], am[0, :4] = 0, 0
    torch.manual_seed(1)
    gen = model.generate(ids, attention_mask=am, max_new_tokens=6, do_sample=True, top_k=20)
    assert gen.shape == (2, 16)
    # the unpadded row decodes exactly as it does alone
    alone = model.generate(ids[1:], attention_mask=am[1:], max_new_tokens=6, do_sample=False)
    both = model.generate(ids, attention_mask=am, max_new_tokens=6, do_sample=False)
    assert torch.equal(alone[0], both[1])


def test_eval_routing_is_deterministic():
    model = tiny_model("qwen2")
    wide.apply_wide(model, wide.WideConfig(sparsity=0.5, ffn_group_size=32))
    ids = torch.randint(3, 96, (3, 11))
    a = model(ids).logits
    masks_a = {k: v.clone() for k, v in model.model.layers[0].wide.group_mask.items()}
    b = model(ids).logits
    assert torch.equal(a, b)
    for k, v in model.model.layers[0].wide.group_mask.items():
        assert torch.equal(v, masks_a[k])


def test_training_is_stochastic_and_only_routers_train():
    model = tiny_model("llama")
    wide.apply_wide(model, wide.WideConfig(sparsity=0.5, ffn_group_size=32))
    model.train()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {n for n, _ in wide.router_parameters(model)} and trainable
    ids = torch.randint(3, 96, (2, 11))
    loss = model(ids, labels=ids).loss + wide.sparsity_stats(model).realized(differentiable=True)
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for _, p in wide.router_parameters(model))
    assert all(p.grad is None for n, p in model.named_parameters() if n not in trainable)


def test_state_dict_keys_kept_and_routers_added():
    model = tiny_model("llama")
    before = set(model.state_dict())
    wide.apply_wide(model, wide.WideConfig(ffn_group_size=32))
    after = set(model.state_dict())
    assert before <= after
    assert all(".wide.routers." in k for k in after - before)


def test_peft_can_target_projections():
    peft = pytest.importorskip("peft")
    model = tiny_model("llama")
    wide.apply_wide(model, wide.WideConfig(ffn_group_size=32, router=AlwaysExecute))
    ids = torch.randint(3, 96, (1, 7))
    ref = model(ids).logits
    cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    pm = peft.get_peft_model(model, cfg)
    assert torch.allclose(pm(input_ids=ids).logits, ref, atol=1e-5)  # LoRA B starts at zero
    assert wide.sparsity_stats(pm) is not None


def test_dense_layers_stay_unrouted():
    model = tiny_model("llama")
    wide.apply_wide(model, wide.WideConfig(ffn_group_size=32, dense_layers=[0, -1]))
    assert [hasattr(layer, "wide") for layer in model.model.layers] == [False, True, False]
    model(torch.randint(3, 96, (1, 5)))
    assert wide.sparsity_stats(model).layers == [1]


@pytest.mark.parametrize(
    ("cfg", "field"),
    [
        pytest.param(dict(attn_group_size=3), "attn_group_size", id="group-not-dividing"),
        pytest.param(dict(attn_group_size=8, ffn_group_size=32), None, id="group-multiple-of-ratio-ok"),
        pytest.param(dict(ffn_group_size=48), "ffn_group_size", id="ffn-not-dividing"),
        pytest.param(dict(granularity="layer", targets="ffn"), "targets", id="layer-needs-all"),
        pytest.param(dict(dense_layers=[5]), "dense_layers", id="dense-out-of-range"),
    ],
)
def test_apply_rejects_bad_fit_before_changing_model(cfg, field):
    model = tiny_model("llama", num_attention_heads=8, num_key_value_heads=2)
    config = wide.WideConfig(**cfg)
    if field is None:
        wide.apply_wide(model, config)
        return
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=f"^{field}:"):
        wide.apply_wide(model, config)
    assert not wide.is_routed(model)
    assert set(model.state_dict()) == set(before)


def test_gqa_misaligned_group():
    model = tiny_model("llama", hidden_size=96, num_attention_heads=12, num_key_value_heads=3)  # 4 per kv head
    with pytest.raises(ValueError, match="^attn_group_size: .*GQA-aligned"):
        wide.apply_wide(model, wide.WideConfig(attn_group_size=6, ffn_group_size=32))


def test_unsupported_architecture_lists_supported():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50))
    with pytest.raises(ValueError, match="not supported; supported: .*llama.*qwen2.*qwen3"):
        wide.apply_wide(model, wide.WideConfig())


def test_apply_twice_rejected():
    model = tiny_model("llama")
    wide.apply_wide(model, wide.WideConfig(ffn_group_size=32))
    with pytest.raises(ValueError, match="already routed"):
        wide.apply_wide(model, wide.WideConfig(ffn_group_size=32))


def test_mistral_and_eager_attention():
    model = tiny_model("mistral")
    model.config._attn_implementation = "eager"
    ids = torch.randint(3, 96, (2, 6))
    ref = model(ids).logits
    wide.apply_wide(model, wide.WideConfig(ffn_group_size=32, router=AlwaysExecute))
    assert model.config._attn_implementation == "wide_eager"
    assert torch.equal(model(ids).logits, ref)
