"""Trained-tensor checkpoints: what they hold, and that the io side gathers nothing (the training side does)."""

import pytest
import torch

import wide
from tests.conftest import tiny_config, tiny_model
from wide.io.checkpoint import (
    IDENTITY_FIELDS,
    check_identity_dicts,
    config_identity,
    is_trained_name,
    model_identity,
    trained_state,
)

CFG = dict(attn_group_size=2, ffn_group_size=32)


def test_trained_state_is_the_routers_and_adapters_as_gathered_for_one_process():
    from peft import LoraConfig, inject_adapter_in_model

    from wide.distributed import gather_trained_state

    model = wide.apply_wide(tiny_model("llama"), wide.WideConfig(**CFG))
    inject_adapter_in_model(LoraConfig(r=2, target_modules=["v_proj"]), model)
    state = trained_state(model)
    assert state and all(".wide.routers." in k or ".lora_" in k for k in state)
    assert any("lora_A" in k for k in state) and all(t.device.type == "cpu" for t in state.values())
    gathered = gather_trained_state(model)
    assert list(state) == list(gathered) and all(torch.equal(state[k], gathered[k]) for k in state)
    assert is_trained_name("model.layers.0.wide.routers.attn.down.weight")
    assert not is_trained_name("model.layers.0.self_attn.q_proj.weight")


def test_identity_from_the_config_alone_compares_the_shapes_only():
    model = tiny_model("llama")
    have = config_identity(tiny_config("llama"))
    check_identity_dicts(model_identity(model), have, fields=IDENTITY_FIELDS)  # no weights: no fingerprint
    with pytest.raises(ValueError, match="^ckpt: made for another model .*embedding_fingerprint"):
        check_identity_dicts(model_identity(model), have, where="ckpt")
    with pytest.raises(ValueError, match="^router_checkpoint: made for another model .*intermediate_size: checkpoint "
                                         "128 vs model 256"):
        check_identity_dicts(model_identity(model), config_identity(tiny_config("llama", intermediate_size=256)),
                             where="router_checkpoint", fields=IDENTITY_FIELDS)
