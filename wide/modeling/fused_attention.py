"""A decode step's q / k / v, RoPE and KV-cache write in one launch (`KernelOptions.decode_qkv`, off by default).

transformers' Llama / Qwen2 attention runs, at a decode step over a static cache, three projections, RoPE on q and k,
and the cache's ``update`` (an ``arange``, a position add, a counter bump, two ``index_copy_``): about ten launches a
layer, each a few µs of latency on small models. With the switch on, `enable_kernels` wraps the attention module's
forward (`install`); a qualifying step — kernels on and the layer's attention routed (or routing off: the dense
step, every q head), one token per row, at most 16 rows, a transformers ``StaticLayer`` cache (initialised, same
dtype and device, not offloaded), plain q / k / v linears, no q / k norms — runs `wide.kernels.decode_qkv` instead (the routed q, the dense
k / v, RoPE, the cache write and its position bump in one launch), then the same attention call and ``o_proj`` as
transformers' forward. Everything else calls the module's own forward. With the attention router on its side stream
(the default, `set_overlap_routing`) the launch computes every q head while the router decides beside it, and the
attention waits for the mask; on one stream the router decides first and the launch skips the q heads of unrun groups.
"""

from __future__ import annotations

import sys

import torch
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from wide.modeling.seam import is_hf_form, wrap_forward

INNER = "_wide_attn_inner_forward"
FORMS = ("LlamaAttention", "Qwen2Attention")
"""transformers attention classes whose forward `_fused_forward` reproduces (q / k / v, RoPE, cache, interface,
o_proj); checked against transformers 5.17 and 5.24."""


def supported(attn: nn.Module) -> bool:
    """Whether ``attn`` is an attention module whose decode step `install` may fuse."""
    return is_hf_form(attn, FORMS) and not hasattr(attn, "q_norm") and not hasattr(attn, "k_norm")


def install(attn: nn.Module, wide_layer) -> None:
    """Wraps ``attn``'s forward (once): qualifying decode steps take the fused launch (module docstring)."""
    wrap_forward(attn, INNER, _forward, _wide_fused_layer=wide_layer)


def _plain(lin) -> bool:
    from wide.modeling.inference import _LinearView

    return isinstance(lin, (nn.Linear, _LinearView)) and lin.weight.dim() == 2 and lin.weight.is_contiguous()


def _static_layer(cache, idx: int, hidden: torch.Tensor):
    """The cache's ``StaticLayer`` for layer ``idx`` when a fused step may write it, else ``None``."""
    layers = getattr(cache, "layers", None)
    if layers is None or idx >= len(layers) or getattr(cache, "offloading", False):
        return None
    layer = layers[idx]
    if type(layer).__name__ != "StaticLayer" or not getattr(layer, "is_initialized", False):
        return None
    keys, values = layer.keys, layer.values
    if keys.dtype != hidden.dtype or keys.device != hidden.device or keys.shape[0] != hidden.shape[0] or \
            values.shape != keys.shape:
        return None
    return layer


def _forward(self: nn.Module, hidden_states: torch.Tensor, *args, **kwargs):
    fused = None if args else _qualifies(self, hidden_states, kwargs)
    if fused is None:
        return getattr(self, INNER)(hidden_states, *args, **kwargs)
    return _fused_forward(self, hidden_states, fused, kwargs)


def _qualifies(self, hidden: torch.Tensor, kwargs: dict):
    from wide.kernels import kernel_options

    wl = self._wide_fused_layer
    # (routing off, `WideRuntime.routing_off`: the dense step of the same model, every q head; `wide bench`'s
    # dense baseline with the same fused launches)
    if not (kernel_options().decode_qkv and wl.use_kernels() and ("attn" in wl.group_mask or not wl.runtime.routing)):
        return None
    if hidden.dim() != 3 or hidden.shape[1] != 1 or torch.compiler.is_compiling():
        return None
    if hidden.shape[0] > 16:
        return None  # one launch takes a 16-row tile (`wide.kernels.triton.decode_qkv.MAX_ROWS`)
    cache = kwargs.get("past_key_values", kwargs.get("cache"))
    pe = kwargs.get("position_embeddings")
    if cache is None or pe is None or self.training:
        return None
    layer = _static_layer(cache, self.layer_idx, hidden)
    if layer is None or layer.keys.shape[-1] != self.head_dim:
        return None
    if not all(_plain(getattr(self, n, None)) for n in ("q_proj", "k_proj", "v_proj")):
        return None
    biases = [getattr(self, n).bias for n in ("q_proj", "k_proj", "v_proj")]
    if any(b is None for b in biases) != all(b is None for b in biases):
        return None
    return layer


def _fused_forward(self, hidden: torch.Tensor, layer, kwargs: dict):
    from wide import kernels

    wl = self._wide_fused_layer
    kwargs = dict(kwargs)
    kwargs.pop("past_key_values", None)
    kwargs.pop("cache", None)
    cos, sin = kwargs.pop("position_embeddings")
    attention_mask = kwargs.pop("attention_mask", None)
    # RoPE rounded as the module's own path would: once under `fuse_glue`'s inductor graph, per product when eager
    rope = getattr(sys.modules[type(self).__module__], "apply_rotary_pos_emb", None)
    args = (hidden, self.q_proj.weight, self.k_proj.weight, self.v_proj.weight)
    kw = dict(q_bias=self.q_proj.bias, k_bias=self.k_proj.bias, v_bias=self.v_proj.bias, cos=cos, sin=sin,
              k_cache=layer.keys, v_cache=layer.values, position=layer.cumulative_length, backend=wl.backend,
              eager_rope=getattr(rope, "_wide_backend", None) != "inductor")
    routed = "attn" in wl.group_mask
    if routed and wl.routing_pending and kernels.kernel_options().decode_qkv_split:
        # k / v and the cache beside the side-stream router, then only the q heads the rows run
        kernels.decode_qkv(*args, None, part="kv", **kw)
        q = kernels.decode_qkv(*args, wl.kernel_mask("attn")[0], part="q", **kw)
    else:
        # a router still deciding on its side stream (`set_overlap_routing`) keeps deciding beside this launch,
        # which then computes every q head (the attention and o_proj wait for the mask); on one stream, the routed q
        mask = None if wl.routing_pending or not routed else wl.kernel_mask("attn")[0]
        q = kernels.decode_qkv(*args, mask, **kw)
    eager = sys.modules[type(self).__module__].eager_attention_forward
    interface = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager)
    extra = {"sliding_window": self.sliding_window} if hasattr(self, "sliding_window") else {}
    out, weights = interface(self, q.transpose(1, 2), layer.keys, layer.values, attention_mask, dropout=0.0,
                             scaling=self.scaling, **extra, **kwargs)
    out = out.reshape(*hidden.shape[:-1], -1).contiguous()
    return self.o_proj(out), weights
