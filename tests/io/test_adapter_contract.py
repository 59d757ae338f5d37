"""Every registered stage-2 adapter (``adapter: lora | super | supra``): LoRA's trainable-parameter budget, a merge
equal to the unmerged forward (fp32), and a checkpoint holding only trained tensors that reloads (sparse support
included) and merges on `wide export`."""

import copy

import pytest
import torch
from peft.tuners.tuners_utils import BaseTunerLayer

import wide
from tests.conftest import tiny_model
from tests.io.adapter_cases import TARGETS, adapted, adapter_checkpoint
from wide.io import ADAPTERS, is_adapter_name, is_trained_name, merge_adapters, read_adapters, read_metadata
from wide.io.loading import load_model

NAMES = ADAPTERS.names()


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_the_built_in_adapters_are_registered():
    assert {"lora", "super", "supra"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("r", [4, 6])
def test_trainable_parameters_equal_lora_of_the_same_rank(name, r):
    model, _ = adapted(tiny_model("llama"), name, r=r)
    trained = sum(p.numel() for n, p in model.named_parameters() if is_adapter_name(n))
    linears = [m for n, m in tiny_model("llama").named_modules() if n.rsplit(".", 1)[-1] in TARGETS]
    assert len(linears) == 3 * len(TARGETS)
    assert trained == sum(r * (m.in_features + m.out_features) for m in linears)


@pytest.mark.parametrize("name", NAMES)
def test_merge_equals_the_unmerged_forward(name):
    model, _ = adapted(tiny_model("llama"), name)
    ids = torch.randint(3, 90, (2, 11))
    ref = _logits(model, ids)
    assert merge_adapters(model) == 3 * len(TARGETS)
    assert not any(isinstance(m, BaseTunerLayer) for m in model.modules())
    assert not any(is_adapter_name(n) for n, _ in [*model.named_parameters(), *model.named_buffers()])
    assert type(model.model.layers[0].self_attn.q_proj) is torch.nn.Linear
    torch.testing.assert_close(_logits(model, ids), ref, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", NAMES)
def test_checkpoint_reloads_and_merges_on_export(name, tiny_model_dir, tmp_path, capsys):
    from safetensors import safe_open

    from wide.cli import main

    ckpt, ref = adapter_checkpoint(tiny_model_dir, tmp_path / "routers.safetensors", name)
    with safe_open(str(ckpt), framework="pt") as f:
        keys = list(f.keys())
    assert all(is_trained_name(k) for k in keys) and any(is_adapter_name(k) for k in keys)
    found = read_adapters(str(ckpt), read_metadata(str(ckpt))["extra"])
    assert list(found) == [name] and found[name]["r"] == 4
    ids = torch.randint(3, 90, (2, 12), generator=torch.Generator().manual_seed(1))
    unmerged = load_model(checkpoint=str(ckpt), device="cpu", merge_lora=False)
    assert unmerged.info["checkpoint"]["adapter"]["name"] == name and not unmerged.info["checkpoint"]["adapter_merged"]
    loaded_bufs = dict(unmerged.model.named_buffers())
    for key, buf in ref.named_buffers():  # the sparse support comes back as saved, not re-chosen
        if is_adapter_name(key):
            assert torch.equal(loaded_bufs[key], buf)
    torch.testing.assert_close(_logits(unmerged.model, ids), _logits(ref, ids))
    merged = load_model(checkpoint=str(ckpt), device="cpu")
    assert merged.info["checkpoint"]["adapter_merged"]
    torch.testing.assert_close(_logits(merged.model, ids), _logits(ref, ids), atol=1e-5, rtol=1e-4)
    out = tmp_path / "exported"
    assert main(["export", "--checkpoint", str(ckpt), "--out", str(out)]) == 0
    assert "wide export: wrote" in capsys.readouterr().out
    exported = wide.load(out, kernels=False)
    assert not any(is_adapter_name(n) for n, _ in [*exported.named_parameters(), *exported.named_buffers()])
    torch.testing.assert_close(_logits(exported, ids), _logits(ref, ids), atol=1e-5, rtol=1e-4)


def test_a_sparse_checkpoint_without_its_settings_or_indices_is_refused(tiny_model_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    ckpt, _ = adapter_checkpoint(tiny_model_dir, tmp_path / "super.safetensors", "super")
    with pytest.raises(ValueError, match="holds SHiRA tensors but does not record its 'super' adapter settings"):
        read_adapters(str(ckpt), {})
    state = {k: v for k, v in load_file(str(ckpt)).items() if ".shira_indices." not in k}
    save_file(state, str(tmp_path / "no-indices.safetensors"))
    with pytest.raises(ValueError, match="SHiRA value tensors but 0 index tensors"):
        read_adapters(str(tmp_path / "no-indices.safetensors"), {"adapter": {"name": "super"}})
    with pytest.raises(ValueError, match="adapter 'nope', which is not registered"):
        read_adapters(str(ckpt), {"adapter": {"name": "nope"}})


@pytest.mark.parametrize("field, kwargs, message", [
    ("adapter", {"adapter": "supr"}, "adapter: unknown adapter 'supr'. Did you mean"),
    ("supra_lora_share", {"adapter": "supra", "supra_lora_share": 1.0}, "supra_lora_share: must be in \\(0, 1\\)"),
    ("supra_lora_share", {"adapter": "supra", "lora_r": 1}, "supra_lora_share: 0.5 of a rank-1 budget"),
    ("sparse_score", {"adapter": "super", "sparse_score": "random"}, "sparse_score: must be one of wanda, magnitude"),
    ("calibration_batches", {"calibration_batches": 0}, "calibration_batches: must be a positive integer"),
], ids=lambda v: v if isinstance(v, str) and " " not in v else None)
def test_bad_adapter_fields_are_named_before_any_load(tiny_model_dir, field, kwargs, message):
    from wide.tasks import LoRARecovery

    with pytest.raises(ValueError, match=f"^{message}"):
        LoRARecovery(model="/nonexistent", routing=wide.WideConfig(attn_group_size=2, ffn_group_size=32), **kwargs)


@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
def test_bf16_backbone_trains_and_merges_on_cuda(name):
    """Stage 2 on a GPU: bf16 backbone, fp32 adapter tensors (SHiRA adds its fp32 sparse delta into a bf16 copy
    of the weight), a backward that reaches every adapter tensor, and a merge that keeps the bf16 forward."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    model, settings = adapted(tiny_model("llama").to(torch.bfloat16), name)
    for n, p in model.named_parameters():
        if is_adapter_name(n):
            p.data = p.data.float()
        p.requires_grad_(is_adapter_name(n))
    model.cuda().train()
    ids = torch.randint(3, 90, (2, 16), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        model(input_ids=ids).logits.float().pow(2).mean().backward()
    grads = [p.grad for n, p in model.named_parameters() if is_adapter_name(n)]
    assert grads and all(g is not None and bool(torch.isfinite(g).all()) for g in grads)
    model.eval()
    ref = _logits(model, ids).float()
    truth = _logits(copy.deepcopy(model).float(), ids).float()  # the unmerged model in fp32
    merge_adapters(model)
    assert model.model.layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16
    # a bf16 forward is itself off the fp32 one (max 0.2 on these logits of mean size 0.13); the merge rounds W + BA
    # to bf16 once more, so the merged model may be off by about as much again, not more (H200, 2026-12-02: a
    # per-element bound of 0.1 failed for LoRA at 0.25 on 0.7% of the logits while its merge is exact in fp32)
    unmerged_err = (ref - truth).abs().mean().item()
    merged_err = (_logits(model, ids).float() - truth).abs().mean().item()
    assert merged_err <= 2 * unmerged_err + 1e-3, (merged_err, unmerged_err)
