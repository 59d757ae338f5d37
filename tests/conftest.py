import pytest
import torch

import wide  # noqa: F401  (registers routers and policies)


def tiny_config(arch: str = "llama", **overrides):
    """A tiny random config with GQA ratio 4 (8 q heads, 2 kv heads)."""
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config, "mistral": MistralConfig}[arch]
    kw = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=8,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=256, pad_token_id=0, eos_token_id=1,
              bos_token_id=2, tie_word_embeddings=False)
    kw.update(overrides)
    return cls(**kw)


def tiny_model(arch: str = "llama", seed: int = 0, **overrides):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(tiny_config(arch, **overrides)).eval()


@pytest.fixture(params=["llama", "qwen2", "qwen3"])
def arch(request):
    return request.param
