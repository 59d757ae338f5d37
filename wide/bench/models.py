"""The models ``wide bench`` times: a local model / asset, or a Llama-3.1-8B-shaped network with random weights."""

from __future__ import annotations

from typing import Optional

import torch


LLAMA_8B = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                head_dim=128, num_hidden_layers=32, vocab_size=128256, max_position_embeddings=131072,
                rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False)


def random_ids(model, shape, device) -> torch.Tensor:
    """Random token ids of ``shape`` (below 1000 and the model's vocabulary) on ``device``."""
    # drawn on the CPU: a failed CUDA-graph capture (reported, then timed eagerly) can leave the CUDA
    # generator unusable, which must not stop the remaining rows
    return torch.randint(0, min(1000, model.config.vocab_size), shape).to(device)


TEXT_ATTR = "_wide_bench_text"
"""The model attribute holding the token stream `bench_ids` cuts rows from (set by `use_text_ids`)."""


def text_tokens(tokenizer, source: str = "default") -> torch.Tensor:
    """``source``'s documents (`wide.data` sources; ``default``: the default corpus's held-out split) as the one token
    stream `wide eval` scores perplexity on (`wide.eval.perplexity.token_stream`), 1-D."""
    from wide.eval.perplexity import token_stream
    from wide.eval.runner import ppl_documents

    stream = torch.from_numpy(token_stream(tokenizer, ppl_documents(source)))
    if stream.numel() < 2:
        raise ValueError(f"{source!r} gave {stream.numel()} tokens")
    return stream


def use_text_ids(model, stream: torch.Tensor) -> None:
    """From now on `bench_ids` cuts ``model``'s ids from ``stream`` (see `text_tokens`)."""
    setattr(model, TEXT_ATTR, stream)


def bench_ids(model, shape, device) -> torch.Tensor:
    """Token ids of ``shape`` ``(rows, tokens)`` for a timed forward: cut from the text stream `use_text_ids` gave
    ``model`` (row ``r`` from offset ``r * n / rows``, wrapping around), else `random_ids`. Trained routers decide on
    content: on random ids they skip another share than on text (issue 22's Qwen routers: 39% by weight on random
    ids, 48% on held-out prose)."""
    stream = getattr(model, TEXT_ATTR, None)
    if stream is None:
        return random_ids(model, shape, device)
    rows, cols = shape
    n = stream.numel()
    offsets = torch.arange(rows) * n // max(rows, 1)
    idx = (offsets[:, None] + torch.arange(cols)[None, :]) % n
    return stream[idx].to(device)


DECODE_TOKENS = 16
"""Tokens a timed decode step cycles through on text ids (`decode_ids`)."""


def decode_ids(model, batch: int, context: int, device, tokens: int = DECODE_TOKENS) -> torch.Tensor:
    """``[K, batch, 1]`` input ids of the timed decode steps: on a text stream (`use_text_ids`) the ``K = tokens``
    tokens that follow each row's ``context``-token prompt (`bench_ids` cuts the prompt at the same offsets), so the
    steps route real tokens and their time and rates average over ``K`` of them; on random ids one random token
    (``K = 1``), as before text ids existed. One token alone is not the model's rate: issue 22's capped Qwen routers
    skipped 27% by weight on the first token of the default corpus and 47% over its prose."""
    stream = getattr(model, TEXT_ATTR, None)
    if stream is None:
        return random_ids(model, (batch, 1), device)[None]
    n = stream.numel()
    offsets = torch.arange(batch) * n // max(batch, 1) + context
    idx = (offsets[None, :] + torch.arange(tokens)[:, None]) % n  # [K, B]
    return stream[idx].unsqueeze(-1).to(device)


def build_model(model: Optional[str], layers: Optional[int], device: str, dtype: torch.dtype):
    """The model to time in eval mode with SDPA attention: ``model`` (an asset, local folder or hub name) or, when it
    is ``None``, the Llama-3.1-8B shape with random weights; ``layers`` keeps only the first N decoder layers."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    if model:
        from wide.assets import resolve_model
        from wide.io.loading import pretrained_lm

        m = pretrained_lm(resolve_model(model), dtype=dtype, attn_implementation="sdpa")
        if layers:
            m.model.layers = m.model.layers[:layers]
            m.config.num_hidden_layers = layers
        return m.to(device).eval()
    cfg = LlamaConfig(**{**LLAMA_8B, **({"num_hidden_layers": layers} if layers else {})})
    cfg._attn_implementation = "sdpa"
    with torch.device(device):
        m = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return m.eval()


def compile_forward(model, backend: str) -> None:
    """``torch.compile`` the model's forward in place (both sides of the bench get the same treatment).

    The routed ops and plans are eager graph breaks (see `wide.kernels.ops`); everything between them —
    HF's RMS norms, RoPE, residual adds, the routers' small ops — is compiled. Every decoder layer and
    shape compiles its own frames, more than dynamo's default of 8 recompiles per frame allows.
    """
    raise_recompile_limits()
    model.forward = torch.compile(model.forward, backend=backend)


def raise_recompile_limits() -> None:
    """Let dynamo keep a frame per decoder layer, shape and batch: more than its default of 8 recompiles per frame."""
    import torch._dynamo

    cfg = torch._dynamo.config
    for name, value in (("recompile_limit", 1024), ("cache_size_limit", 1024),
                        ("accumulated_recompile_limit", 16384), ("accumulated_cache_size_limit", 16384)):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), value))
