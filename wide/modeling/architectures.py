"""The per-architecture target table: where each supported HF model keeps what `wide` routes.

One row per ``config.model_type``; no per-model patch functions. Routing hooks into three seams that
every row names: the attention module (its attention function is wrapped through transformers'
``AttentionInterface``), the MLP's activation module (gate/up outputs are masked after the activation,
so gate/up/down stay the original ``nn.Linear`` modules peft can target) and the two pre-norm modules
whose inputs are the residual stream the routers read.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ArchSpec:
    """Attribute paths inside one architecture (relative to the causal LM, then to one decoder layer)."""

    layers: str = "model.layers"
    attn: str = "self_attn"
    mlp: str = "mlp"
    attn_norm: str = "input_layernorm"
    """Norm whose input is the residual stream before attention."""
    ffn_norm: str = "post_attention_layernorm"
    """Norm whose input is the residual stream before the FFN."""
    act: str = "act_fn"
    q_proj: str = "q_proj"
    k_proj: str = "k_proj"
    v_proj: str = "v_proj"
    o_proj: str = "o_proj"
    gate_proj: str = "gate_proj"
    up_proj: str = "up_proj"
    down_proj: str = "down_proj"


ARCHITECTURES: dict[str, ArchSpec] = {
    "llama": ArchSpec(),
    "mistral": ArchSpec(),
    "qwen2": ArchSpec(),
    "qwen3": ArchSpec(),
    "gemma3_text": ArchSpec(ffn_norm="pre_feedforward_layernorm"),
}


def arch_for(config) -> ArchSpec:
    model_type = getattr(config, "model_type", None)
    if model_type not in ARCHITECTURES:
        raise ValueError(
            f"model: architecture {model_type!r} is not supported; supported: {', '.join(sorted(ARCHITECTURES))}"
        )
    return ARCHITECTURES[model_type]


def get_path(root, path: str):
    for part in path.split("."):
        root = getattr(root, part)
    return root
