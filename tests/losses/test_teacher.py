"""The distillation teacher is the dense backbone: routing off (no router called, every mask executes, nothing
recorded), LoRA disabled, no grad; and the objective equals a plain implementation with full logits."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import wide
from tests.conftest import tiny_model
from wide.losses import LossConfig, adapters_disabled, objective, teacher_mode

ROUTING = wide.WideConfig(attn_group_size=2, ffn_group_size=32)


def _batch(seed=0, b=2, t=12, vocab=96):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (b, t), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def _routed(arch, lora=False):
    dense = tiny_model(arch)
    model = wide.apply_wide(copy.deepcopy(dense), ROUTING)
    if lora:
        from peft import LoraConfig, inject_adapter_in_model

        inject_adapter_in_model(LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "down_proj"]), model)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.5)  # peft starts B at zero: make the adapters change the output
                if "lora_" in name:
                    p.requires_grad_(True)
    return dense, model.train()


def test_teacher_pass_calls_no_router_executes_every_group_and_records_nothing(arch, monkeypatch):
    dense, model = _routed(arch)
    batch = _batch()
    wide.modeling.runtime_of(model).set_noise(3)
    model(**batch)
    before = wide.sparsity_stats(model)
    assert before is not None and before.realized() > 0
    calls = []
    for _, router in ((n, m) for n, m in model.named_modules() if isinstance(m, wide.Router)):
        monkeypatch.setattr(router, "forward", lambda *a, **k: calls.append(1))
        monkeypatch.setattr(router, "execute_decision", lambda *a, **k: calls.append(1))
    with teacher_mode(model):
        out = model(**batch)
        layers = wide.modeling.runtime_of(model).layers
        assert all(not wl.group_mask and wl.ffn_mask is None and not wl.routes_heads for wl in layers)
    assert calls == []
    assert not out.logits.requires_grad
    after = wide.sparsity_stats(model)
    assert after.layers == before.layers
    assert all(torch.equal(after.skip[k], before.skip[k]) for k in before.kinds)
    with torch.no_grad():
        want = dense.train()(**batch).logits
    torch.testing.assert_close(out.logits, want, rtol=0, atol=0)


def test_teacher_disables_lora_and_keeps_requires_grad(arch):
    dense, model = _routed(arch, lora=True)
    batch = _batch(1)
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    with torch.no_grad():
        with wide.modeling.runtime_of(model).routing_off():
            with_lora = model(**batch).logits
        with teacher_mode(model):
            without = model(**batch).logits
        base = dense(**batch).logits
    assert not torch.allclose(with_lora, base, atol=1e-3)  # the adapters do change the output
    torch.testing.assert_close(without, base, rtol=0, atol=0)
    assert flags == {n: p.requires_grad for n, p in model.named_parameters()}
    with adapters_disabled(model):
        pass
    with torch.no_grad(), wide.modeling.runtime_of(model).routing_off():
        torch.testing.assert_close(model(**batch).logits, with_lora, rtol=0, atol=0)  # re-enabled afterwards


def _plain_objective(dense, model, batch, cfg: LossConfig):
    """Full logits both sides, F.cross_entropy and F.kl_div; the teacher is a separate dense copy."""
    with torch.no_grad():
        t_out = dense.train()(**batch, output_hidden_states=True)
    s_out = model(**batch, output_hidden_states=True)
    labels = batch["labels"][:, 1:].reshape(-1)
    z = s_out.logits[:, :-1].reshape(-1, s_out.logits.shape[-1]).float()
    zt = t_out.logits[:, :-1].reshape(-1, z.shape[-1]).float()
    valid = labels != -100
    T = cfg.temperature
    total = cfg.lm * F.cross_entropy(z, labels, ignore_index=-100)
    kl = F.kl_div(F.log_softmax(z / T, -1), F.log_softmax(zt / T, -1), log_target=True, reduction="none").sum(-1)
    total = total + cfg.kd * T * T * kl[valid].mean()
    if cfg.hidden:
        m = batch["attention_mask"].float()
        per_layer = []
        for s, t in zip(s_out.hidden_states[1:], t_out.hidden_states[1:]):
            s, t = F.rms_norm(s, s.shape[-1:], eps=1e-6), F.rms_norm(t, t.shape[-1:], eps=1e-6)
            per_layer.append((((s - t) ** 2).mean(-1) * m).sum() / m.sum())
        total = total + cfg.hidden * torch.stack(per_layer).mean()
    return total


@pytest.mark.parametrize("cfg", [
    pytest.param(LossConfig(), id="lm"),
    pytest.param(LossConfig(lm=0.0, kd=1.0, temperature=2.0), id="kd-T2"),
    pytest.param(LossConfig(lm=0.5, kd=1.0, temperature=1.5, hidden=0.3, chunk_size=7), id="lm-kd-hidden"),
])
def test_objective_equals_plain_full_logits_implementation(arch, cfg):
    dense, model = _routed(arch)
    batch = _batch(2)
    runtime = wide.modeling.runtime_of(model)
    runtime.set_noise(11)
    got = objective(model, batch, cfg)
    got_grads = torch.autograd.grad(got.total, [p for _, p in wide.router_parameters(model)])
    runtime.set_noise(11)
    want = _plain_objective(dense, model, batch, cfg)
    want_grads = torch.autograd.grad(want, [p for _, p in wide.router_parameters(model)])
    torch.testing.assert_close(got.total, want, rtol=1e-5, atol=1e-6)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-7)


def test_lm_objective_equals_hf_loss_under_lora(arch):
    _, model = _routed(arch, lora=True)
    batch = _batch(3)
    runtime = wide.modeling.runtime_of(model)
    runtime.set_noise(5)
    torch.manual_seed(0)  # LoRA dropout
    want = model(**batch).loss
    runtime.set_noise(5)
    torch.manual_seed(0)
    got = objective(model, batch, LossConfig(chunk_size=5)).total
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_loss_config_rejects_bad_fields():
    with pytest.raises(ValueError, match="^loss.kd: must be a number >= 0"):
        LossConfig(kd=-1)
    with pytest.raises(ValueError, match="^loss: lm, kd and hidden are all 0"):
        LossConfig(lm=0)
    with pytest.raises(ValueError, match="^loss.temperature: must be > 0"):
        LossConfig(kd=1, temperature=0)
    with pytest.raises(ValueError, match="^loss.backend: must be one of"):
        LossConfig(backend="fast")


def test_liger_backend_without_liger_fails_when_configured(monkeypatch):
    import sys

    monkeypatch.setattr(sys.modules["wide.losses.objective"], "liger_available", lambda: False)
    with pytest.raises(ValueError, match=r"^loss.backend: 'liger' needs Liger-Kernel \(pip install 'wide\[liger\]'\)"):
        LossConfig(backend="liger")
