"""Routed attention through transformers' ``AttentionInterface``.

For every base implementation ``X`` (``sdpa``, ``eager``, ``flex_attention``, ``flash_attention_*``)
we register ``wide_X``: it runs ``X`` and zeroes the output of each (token, head group) the router
skipped. Zeroing the attention output of a head equals skipping that head's Q projection columns,
its attention and its O projection input columns, so this is the exact reference semantics while the
HF attention module (cache handling, RoPE, q/k norms, biases, sliding windows) stays untouched.
"""

from __future__ import annotations

import sys

import torch

from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

from wide.modeling.layer import mask_heads

PREFIX = "wide_"


def _base_function(module, base: str):
    if base == "eager":
        # eager attention is defined per modeling file; take the one of the module's own architecture
        return sys.modules[type(module).__module__].eager_attention_forward
    return ALL_ATTENTION_FUNCTIONS[base]


def _kernel_ok(module, layer, query, attention_mask, kwargs) -> bool:
    # the fused kernels handle plain causal attention over a complete cache, and decode steps and prompt
    # chunks over a cache of an unpadded batch; padding masks, sliding windows, soft-capping and attention
    # dropout take the reference path
    if (kwargs.get("sliding_window") is not None or kwargs.get("softcap") is not None or kwargs.get("dropout")
            or kwargs.get("output_attentions")):
        return False
    if attention_mask is None:
        return True
    return _static_decode_mask(layer, query, attention_mask) or _causal_chunk_mask(layer, query, attention_mask)


def _static_decode_mask(layer, query, attention_mask) -> bool:
    """A decode step (one query per row) whose 4D mask only hides the static cache's empty tail."""
    if not (query.shape[2] == 1 and isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 4
            and attention_mask.shape[2] == 1):
        return False
    return layer.runtime.padded(_visible(attention_mask)) is False


def _causal_chunk_mask(layer, query, attention_mask) -> bool:
    """A prompt chunk (``T > 1`` queries after the cache's first ``p`` keys) whose 4D mask is the plain causal
    mask of an unpadded batch: query ``i`` sees keys ``[0, p + i]``.

    Eagerly that is checked once per forward (one host sync); under CUDA-graph capture it cannot be, so it is
    taken on trust only where the runtime says so (``WideRuntime.causal_chunks``, set by `wide.Generator`,
    which builds the chunks itself), and otherwise the chunk takes the reference path."""
    t = query.shape[2]
    if not (t > 1 and isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 4
            and attention_mask.shape[1] == 1 and attention_mask.shape[2] == t):
        return False
    runtime = layer.runtime
    if runtime.padded() is not False:
        return False
    cache = runtime.forward_cache
    hit = cache.get("chunk_causal")
    if hit is not None and hit[0] is attention_mask:
        return hit[1]
    if runtime.causal_chunks:
        ok = True
    elif torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        ok = False
    else:
        vis = _visible_rows(attention_mask)  # [B, T, S]
        start = _chunk_positions(layer, attention_mask, t)[1].view(-1, 1)  # [B, 1]: the chunk's first position
        j = torch.arange(vis.shape[-1], device=vis.device)
        want = j.view(1, 1, -1) <= (start + torch.arange(t, device=vis.device).view(1, -1)).unsqueeze(-1)
        ok = bool((start >= 0).all() & (vis == want).all())  # one host sync
    cache["chunk_causal"] = (attention_mask, ok)
    return ok


def _chunk_positions(layer, attention_mask: torch.Tensor, t: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(lengths, q_offset)``, each ``[B]`` int32, of a causal chunk mask (see :func:`_causal_chunk_mask`): the
    keys its last query sees and its first query's position; reduced on the device once per forward."""
    cache = layer.runtime.forward_cache
    hit = cache.get("chunk_positions")
    if hit is not None and hit[0] is attention_mask:
        return hit[1]
    lengths = _count_visible(attention_mask)
    cache["chunk_positions"] = (attention_mask, (lengths, lengths - t))
    return lengths, lengths - t


def _visible_rows(attention_mask: torch.Tensor) -> torch.Tensor:
    """``[B, T, S]`` bool: the keys a mask ``[B, 1, T, S]`` (bool or additive) lets each query see."""
    m = attention_mask[:, 0]
    return m if m.dtype == torch.bool else m == 0


def _visible(attention_mask: torch.Tensor) -> torch.Tensor:
    """``[B, S]`` bool: the keys a mask ``[B, 1, T, S]`` (bool or additive) lets each row's last query see (a
    decode step's only one)."""
    m = attention_mask[:, 0, -1, :]
    return m if m.dtype == torch.bool else m == 0


def _valid_lengths(layer, attention_mask: torch.Tensor) -> torch.Tensor:
    """``[B]`` int32 count of visible keys per row of an unpadded decode mask, reduced once per forward:
    every layer gets the same mask (at batch 16 and a 4k context the strided reduction took 9.4 us per
    layer on the H200, 4% of a routed decode step)."""
    cache = layer.runtime.forward_cache
    hit = cache.get("decode_lengths")
    if hit is not None and hit[0] is attention_mask:
        return hit[1]
    lengths = _count_visible(attention_mask)
    cache["decode_lengths"] = (attention_mask, lengths)
    return lengths


def _count_visible(attention_mask: torch.Tensor) -> torch.Tensor:
    return _visible(attention_mask).sum(-1, dtype=torch.int32)


def _kernel_attention(layer, query, key, value, scaling, attention_mask=None):
    from wide import kernels

    mask, plan = layer.kernel_mask("attn")
    q = query.transpose(1, 2)  # [B, T, Hq, D] views of HF's [B, H, T, D]: no copies
    k = key.transpose(1, 2)
    v = value.transpose(1, 2)
    t = q.shape[1]
    if t == 1:
        # unpadded rows see a prefix of the cache: the mask reduces to a length per row (no host sync)
        lengths = _valid_lengths(layer, attention_mask) if attention_mask is not None else None
        return kernels.attention_decode(q, k, v, mask, lengths=lengths, scale=scaling, backend=layer.backend,
                                        density=plan.density_hint)
    if attention_mask is not None:
        # a prompt chunk over the cache (`_causal_chunk_mask`): queries at the last t of each row's visible keys
        lengths, q_offset = _chunk_positions(layer, attention_mask, t)
        return kernels.attention_prefill(q, k, v, mask, causal=True, scale=scaling, lengths=lengths,
                                         q_offset=q_offset, plan=plan, backend=layer.backend)
    # without a mask, transformers means sdpa's is_causal, which aligns queries to the *first* keys
    # (a static cache holds its empty tail after them): no query sees past key t-1
    return kernels.attention_prefill(q, k[:, :t], v[:, :t], mask, causal=True, scale=scaling, plan=plan,
                                     backend=layer.backend)


def _make(base: str):
    def routed_attention(module, query, key, value, attention_mask, **kwargs):
        layer = getattr(module, "_wide_layer", None)
        if layer is not None and layer.routes_heads and layer.use_kernels() and _kernel_ok(
                module, layer, query, attention_mask, kwargs):
            out = _kernel_attention(layer, query, key, value, kwargs.get("scaling"), attention_mask)
            layer.mark_heads_zeroed()
            return out, None
        out, weights = _base_function(module, base)(module, query, key, value, attention_mask, **kwargs)
        if layer is not None and layer.routes_heads:
            out = mask_heads(out, layer.head_mask)
            layer.mark_heads_zeroed()
        return out, weights

    routed_attention.__name__ = f"{PREFIX}{base}"
    return routed_attention


def routed_name(base: str | None) -> str:
    """Registers (once) and returns the routed twin of attention implementation ``base``."""
    base = base or "eager"
    if base.startswith(PREFIX):
        return base
    name = PREFIX + base
    if name not in AttentionInterface._global_mapping:
        if base != "eager" and base not in ALL_ATTENTION_FUNCTIONS:
            raise ValueError(f"model: attention implementation {base!r} is not known to transformers")
        AttentionInterface.register(name, _make(base))
        mask_fn = ALL_MASK_ATTENTION_FUNCTIONS._global_mapping.get(base)
        if mask_fn is None:
            mask_fn = ALL_MASK_ATTENTION_FUNCTIONS._global_mapping["sdpa"]
        AttentionMaskInterface.register(name, mask_fn)
    return name


def base_name(name: str) -> str:
    return name[len(PREFIX):] if name and name.startswith(PREFIX) else name
