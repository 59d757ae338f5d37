"""Adapters: one merge for every peft kind, LoRA settings read back from a checkpoint, and a new kind plugged in
by one subclass and one registration (saved, read back, injected and merged like LoRA)."""

import pytest
import torch

import wide
from tests.conftest import tiny_model
from wide.io import ADAPTERS, Adapter, is_trained_name, merge_adapters, read_adapters, register_adapter, save_trained
from wide.io.loading import load_model

CFG = dict(sparsity=0.5, attn_group_size=2, ffn_group_size=32)


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def _randomize(model, marker: str, seed: int = 0):
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if marker in name or ".wide.routers." in f".{name}":
                p.copy_(1 + 0.3 * torch.randn_like(p) if marker == "ia3_" else 0.3 * torch.randn_like(p))


def _peft_config(kind: str):
    from peft import IA3Config, LoraConfig, ShiraConfig

    return {"lora": LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "down_proj"]),
            "shira": ShiraConfig(r=2, target_modules=["q_proj", "down_proj"], random_seed=1),
            "ia3": IA3Config(target_modules=["q_proj", "down_proj"], feedforward_modules=["down_proj"])}[kind]


@pytest.mark.parametrize("kind, marker", [("lora", "lora_"), ("shira", "shira_"), ("ia3", "ia3_")])
def test_merge_adapters_folds_every_peft_kind(kind, marker):
    from peft import inject_adapter_in_model

    model = wide.apply_wide(tiny_model("llama"), wide.WideConfig(**CFG))
    inject_adapter_in_model(_peft_config(kind), model)
    _randomize(model, marker)
    ids = torch.randint(3, 90, (2, 9))
    ref = _logits(model, ids)
    assert merge_adapters(model) == 2 * 3  # q_proj and down_proj of 3 layers
    assert not any(marker in n for n, _ in model.named_parameters())
    for layer in model.model.layers:
        assert type(layer.self_attn.q_proj) is torch.nn.Linear and type(layer.mlp.down_proj) is torch.nn.Linear
    torch.testing.assert_close(_logits(model, ids), ref, atol=1e-5, rtol=1e-4)
    assert merge_adapters(model) == 0


def test_lora_settings_read_back_and_their_errors(tmp_path, caplog):
    shapes = {"m.layers.0.self_attn.q_proj.lora_A.default.weight": (4, 64),
              "m.layers.0.self_attn.q_proj.lora_B.default.weight": (64, 4),
              "m.layers.0.mlp.down_proj.lora_A.default.weight": (4, 128),
              "m.layers.0.wide.routers.ffn.down.weight": (8, 64)}
    lora = ADAPTERS.get("lora")()
    assert lora.read(shapes, {"lora_alpha": 8}, "c") == {"r": 4, "alpha": 8.0, "alpha_source": "checkpoint",
                                                          "targets": ["down_proj", "q_proj"]}
    assert lora.read(shapes, {}, "c", alpha=16)["alpha_source"] == "flag"
    assert lora.read(shapes, {}, "c.safetensors")["alpha"] == 32.0 and "not recorded in c.safetensors" in caplog.text
    assert lora.read({"m.wide.routers.ffn.down.weight": (8, 64)}, {}, "c") is None
    with pytest.raises(ValueError, match=r"^lora_alpha: the checkpoint records 8.0, got 16"):
        lora.read(shapes, {"lora_alpha": 8}, "c", alpha=16)
    with pytest.raises(ValueError, match=r"^checkpoint: LoRA adapters of mixed ranks \[2, 4\]"):
        lora.read({**shapes, "m.layers.1.mlp.up_proj.lora_A.default.weight": (2, 64)}, {}, "c")


def test_a_registered_adapter_kind_is_saved_read_injected_and_merged(tmp_path, tiny_model_dir, monkeypatch):
    """peft's IA3 as a throw-away kind: one subclass, one registration, and a checkpoint of it loads like LoRA."""
    from peft import IA3Config, inject_adapter_in_model
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(ADAPTERS, "_items", dict(ADAPTERS._items))  # the registration ends with this test

    @register_adapter("ia3")
    class IA3(Adapter):
        marker = "ia3_"

        def peft_config(self, settings):
            return IA3Config(target_modules=settings["targets"], feedforward_modules=settings["feedforward"])

        def read(self, shapes, extra, where):
            targets = sorted({k.split(".ia3_l.")[0].rsplit(".", 1)[-1] for k in shapes if ".ia3_l." in k})
            return {"targets": targets, "feedforward": [t for t in targets if t == "down_proj"]} if targets else None

    assert is_trained_name("model.layers.0.self_attn.q_proj.ia3_l.default")
    cfg = wide.WideConfig(**CFG)
    ref = wide.apply_wide(AutoModelForCausalLM.from_pretrained(tiny_model_dir), cfg).eval()
    inject_adapter_in_model(_peft_config("ia3"), ref)
    _randomize(ref, "ia3_")
    path = save_trained(ref, tmp_path / "ia3.safetensors", config=cfg, stage="lora", extra={"model": tiny_model_dir})
    assert read_adapters(str(path), {}) == {"ia3": {"targets": ["down_proj", "q_proj"], "feedforward": ["down_proj"]}}
    loaded = load_model(checkpoint=str(path), device="cpu")
    assert not any("ia3_" in n for n, _ in loaded.model.named_parameters())
    ids = torch.randint(3, 90, (2, 12))
    torch.testing.assert_close(_logits(loaded.model, ids), _logits(ref, ids), atol=1e-5, rtol=1e-4)


def test_a_plugin_adapter_by_class_path_trains_saves_and_reloads(tiny_model_dir, tmp_path):
    """``adapter: tests.io.plugin_adapter.LoHa``: imported (so registered) by the stage, recorded with its class
    path, and a checkpoint of it reloads and merges like a built-in one."""
    from wide.tasks import LoRARecovery

    def task(adapter):
        return LoRARecovery(model=tiny_model_dir, routing=wide.WideConfig(**CFG), adapter=adapter, lora_r=2,
                            lora_targets=["q_proj", "down_proj"])

    stage = task("tests.io.plugin_adapter.LoHa")
    assert stage.adapter == "test-loha" and "test-loha" in ADAPTERS
    stage.configure_model()
    model = stage.model.eval()
    assert any(p.requires_grad for n, p in model.named_parameters() if "hada_" in n)
    _randomize(model, "hada_")
    path = save_trained(model, tmp_path / "loha.safetensors", config=stage.routing, stage="lora",
                        extra={"model": tiny_model_dir, **stage.checkpoint_extra()})
    assert stage.checkpoint_extra()["adapter"]["class_path"] == "tests.io.plugin_adapter.LoHa"
    loaded = load_model(checkpoint=str(path), device="cpu")
    assert loaded.info["checkpoint"]["adapter"]["name"] == "test-loha" and loaded.info["checkpoint"]["adapter_merged"]
    ids = torch.randint(3, 90, (2, 12))
    torch.testing.assert_close(_logits(loaded.model, ids), _logits(model, ids), atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match=r"^adapter: 'tests.io.plugin_adapter.NotAnAdapter' is not an Adapter"):
        task("tests.io.plugin_adapter.NotAnAdapter")
    with pytest.raises(ValueError, match=r"^adapter: class_path 'tests.io.nope.LoHa' cannot be imported"):
        task("tests.io.nope.LoHa")
