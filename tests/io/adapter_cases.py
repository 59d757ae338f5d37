"""Stage-2 adapter fixtures shared by the io, eval and deploy tests: a routed tiny model with a registered adapter
injected as ``LoRARecovery`` does, its sparse support calibrated, and every trained tensor made non-trivial."""

import torch

import wide
from wide.io import ADAPTERS, is_adapter_name, save_trained

TARGETS = ["q_proj", "v_proj", "down_proj"]
CFG = dict(sparsity=0.5, attn_group_size=2, ffn_group_size=32)


def adapted(model, name: str, r: int = 4, seed: int = 0):
    """``(model, settings)``: ``model`` routed, adapter ``name`` of budget rank ``r`` injected, its support chosen
    from two random batches (when it calibrates), routers and adapter values random; eval mode."""
    kind = ADAPTERS.get(name)()
    settings = kind.settings(r=r, alpha=8.0, dropout=0.0, targets=TARGETS)
    model = wide.apply_wide(model, wide.WideConfig(**CFG))
    kind.inject(model, settings)
    g = torch.Generator().manual_seed(seed)
    if kind.needs_calibration(settings):
        batches = [{"input_ids": torch.randint(3, 90, (2, 16), generator=g)} for _ in range(2)]
        assert "Wanda" in kind.calibrate(model, batches, settings)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if is_adapter_name(n) or ".wide.routers." in f".{n}":
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return model.eval(), settings


def adapter_checkpoint(model_dir: str, path, name: str, r: int = 4):
    """``(checkpoint path, reference model)``: a stage-2 checkpoint of adapter ``name``, as `wide fit` writes it."""
    from transformers import AutoModelForCausalLM

    model, settings = adapted(AutoModelForCausalLM.from_pretrained(model_dir), name, r)
    ckpt = save_trained(model, path, config=model.wide_config, stage="lora", step=2,
                        extra={"model": model_dir, "adapter": {"name": name, **settings}})
    return ckpt, model
