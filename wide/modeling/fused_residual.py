"""A decode step's residual adds inside ``o_proj`` / ``down_proj`` (`KernelOptions.decode_residual`, off by default).

transformers' Llama / Qwen2 decoder layer adds each sub-layer's output to the residual stream in a kernel of its own
(two a layer, each a few µs of latency at a decode step). With the switch on, `enable_kernels` wraps the decoder
layer's forward (`install`); a qualifying step — kernels on, one token per row, at most 64 rows, not compiling —
runs the same sequence (norm, attention, add, norm, MLP, add) but hands each residual to the routed reduction-width
GEMM that ends the sub-layer (`RoutedLinear` ``o_proj``, `RoutedMLP`'s ``down_proj``), which adds it in its epilogue
(`wide.kernels.gemm_k` ``residual=``: fp32, one rounding, where transformers rounds the projection and the sum). A
sub-layer that does not take it (its reference path, wide FFN groups as experts) leaves it, and the add runs here as
before. Everything else calls the layer's own forward.
"""

from __future__ import annotations

import torch
from torch import nn

from wide.modeling.seam import is_hf_form, wrap_forward

INNER = "_wide_layer_inner_forward"
FORMS = ("LlamaDecoderLayer", "Qwen2DecoderLayer")
"""transformers decoder layers whose forward `_fused_forward` reproduces (checked against 5.17 and 5.24)."""


def supported(layer: nn.Module) -> bool:
    return is_hf_form(layer, FORMS) and all(
        hasattr(layer, n) for n in ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp"))


def install(layer: nn.Module, wide_layer) -> None:
    """Wraps the decoder ``layer``'s forward (once): qualifying decode steps fuse the residual adds."""
    wrap_forward(layer, INNER, _forward, _wide_residual_layer=wide_layer)


def _forward(self: nn.Module, hidden_states: torch.Tensor, *args, **kwargs):
    from wide.kernels import kernel_options

    wl = self._wide_residual_layer
    if (args or not kernel_options().decode_residual or not wl.use_kernels() or hidden_states.dim() != 3
            or hidden_states.shape[1] != 1 or hidden_states.shape[0] > 64 or torch.compiler.is_compiling()):
        return getattr(self, INNER)(hidden_states, *args, **kwargs)
    residual = hidden_states
    h = self.input_layernorm(hidden_states)
    wl.pending_residual["attn"] = residual
    try:
        h = self.self_attn(hidden_states=h, **kwargs)[0]
    finally:
        left = wl.pending_residual.pop("attn", None)
    if left is not None:  # the attention's o_proj did not take it
        h = residual + h
    residual = h
    h = self.post_attention_layernorm(h)
    wl.pending_residual["ffn"] = residual
    try:
        h = self.mlp(h)
    finally:
        left = wl.pending_residual.pop("ffn", None)
    return h if left is None else residual + h
