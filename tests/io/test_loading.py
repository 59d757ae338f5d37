"""`load_model`: dense, training-free routing, stage-1 and stage-2 (LoRA) checkpoints from `wide fit`."""

import pytest
import torch

import wide
from wide.io.checkpoint import save_trained
from wide.io.loading import load_model

CFG = dict(sparsity=0.5, attn_group_size=2, ffn_group_size=32)


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits


def _trained(tiny_model_dir, cfg, lora: bool, seed=1):
    """A routed model with non-trivial router (and LoRA) weights, as `wide fit` would leave it."""
    from peft import LoraConfig, inject_adapter_in_model
    from transformers import AutoModelForCausalLM

    model = wide.apply_wide(AutoModelForCausalLM.from_pretrained(tiny_model_dir), cfg)
    if lora:
        inject_adapter_in_model(LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]), model)
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".wide.routers." in f".{name}" or "lora_" in name:
                p.normal_(0, 0.5)
    return model.eval()


def test_dense_and_training_free(tiny_model_dir):
    dense = load_model(tiny_model_dir, device="cpu")
    assert dense.info["method"] == "dense" and dense.info["routing"] is None and not wide.is_routed(dense.model)
    topk = load_model(tiny_model_dir, routing=wide.WideConfig(router="topk", **CFG), device="cpu")
    assert topk.info["method"] == "width/topk" and wide.is_routed(topk.model) and not topk.model.training
    assert "untrained_router" not in topk.info


def test_untrained_learnable_router_is_flagged(tiny_model_dir, caplog):
    loaded = load_model(tiny_model_dir, routing=wide.WideConfig(**CFG), device="cpu")
    assert loaded.info["untrained_router"] and "random init" in caplog.text


def test_stage1_checkpoint_round_trip(tiny_model_dir, tmp_path):
    cfg = wide.WideConfig(granularity="sublayer", **CFG)
    ref = _trained(tiny_model_dir, cfg, lora=False)
    path = save_trained(ref, tmp_path / "routers.safetensors", config=cfg, stage="calibrate", step=7,
                        extra={"model": tiny_model_dir})
    loaded = load_model(checkpoint=str(tmp_path), device="cpu")  # folder + model from the checkpoint
    assert loaded.info["model"] == tiny_model_dir and loaded.info["checkpoint"]["step"] == 7
    assert loaded.info["method"] == "sublayer/lowrank" and loaded.info["checkpoint"]["lora"] is None
    ids = torch.randint(3, 90, (2, 12))
    torch.testing.assert_close(_logits(loaded.model, ids), _logits(ref, ids))
    with pytest.raises(ValueError, match="either a checkpoint or routing"):
        load_model(tiny_model_dir, checkpoint=str(path), routing=cfg, device="cpu")


@pytest.mark.parametrize("alpha_recorded", [True, False], ids=["alpha-in-metadata", "alpha-flag"])
def test_lora_checkpoint_is_injected_loaded_and_merged(tiny_model_dir, tmp_path, alpha_recorded):
    cfg = wide.WideConfig(**CFG)
    ref = _trained(tiny_model_dir, cfg, lora=True)
    extra = {"model": tiny_model_dir, **({"lora_alpha": 8} if alpha_recorded else {})}
    path = save_trained(ref, tmp_path / "lora.safetensors", config=cfg, stage="lora", step=3, extra=extra)
    loaded = load_model(checkpoint=str(path), device="cpu", lora_alpha=None if alpha_recorded else 8)
    lora = loaded.info["checkpoint"]["lora"]
    assert lora["r"] == 4 and lora["alpha"] == 8 and lora["targets"] == ["down_proj", "q_proj", "v_proj"]
    assert loaded.info["checkpoint"]["adapter_merged"]
    # merged: plain nn.Linear modules again, no adapter parameters left
    assert not any("lora_" in n for n, _ in loaded.model.named_parameters())
    assert type(loaded.model.model.layers[0].self_attn.q_proj) is torch.nn.Linear
    ids = torch.randint(3, 90, (2, 12))
    torch.testing.assert_close(_logits(loaded.model, ids), _logits(ref, ids), atol=1e-4, rtol=1e-4)
    unmerged = load_model(checkpoint=str(path), device="cpu", lora_alpha=8, merge_lora=False)
    torch.testing.assert_close(_logits(unmerged.model, ids), _logits(ref, ids))
