"""Model folders: `export` merges adapters and writes a folder that `load` restores, routed and ready to generate."""

import pytest
import torch

import wide
from wide.io.folder import export, load


def test_export_merges_lora_and_reloads(tmp_path, tiny_model_dir):
    from peft import LoraConfig, inject_adapter_in_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    wide.apply_wide(model, wide.WideConfig(attn_group_size=2, ffn_group_size=32))
    inject_adapter_in_model(LoraConfig(r=4, target_modules=["q_proj", "down_proj"]), model)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)  # a non-trivial adapter
    ids = torch.randint(3, 96, (2, 8))
    ref = model(ids).logits
    export(model, tmp_path / "exported")
    assert (tmp_path / "exported" / "model.safetensors").is_file()
    again = load(tmp_path / "exported")
    torch.testing.assert_close(again(ids).logits, ref, atol=1e-4, rtol=1e-4)
    gen = again.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=5, do_sample=False)
    assert gen.shape == (2, 13)


@pytest.mark.slow
def test_exported_smollm2_reloads_and_generates_on_cpu(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from wide.assets import resolve_model

    path = resolve_model("smollm2-135m")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    wide.apply_wide(model, wide.WideConfig(sparsity=0.5, attn_group_size=3, ffn_group_size=64, router="topk"))
    export(model, tmp_path / "smollm2-wide", tokenizer=tok)
    again = load(tmp_path / "smollm2-wide")
    enc = tok(["The capital of France is"], return_tensors="pt")
    out = again.generate(**enc, max_new_tokens=12, do_sample=False)
    text = tok.decode(out[0], skip_special_tokens=True)
    assert len(out[0]) > enc["input_ids"].shape[1] and text.startswith("The capital of France is")
    assert 0.3 < wide.sparsity_stats(again).realized().item() < 0.7
