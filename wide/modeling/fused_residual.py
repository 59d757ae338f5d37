"""A decode step's residual adds inside ``o_proj`` / ``down_proj`` (`KernelOptions.decode_residual`, off by default).

transformers' Llama / Qwen2 decoder layer adds each sub-layer's output to the residual stream in a kernel of its own
(two a layer, each a few µs of latency at a decode step). With the switch on, `enable_kernels` wraps the decoder
layer's forward (`install`); a qualifying step — kernels on, one token per row, at most 64 rows, not compiling —
runs the same sequence (norm, attention, add, norm, MLP, add) but hands each residual to the routed reduction-width
GEMM that ends the sub-layer (`RoutedLinear` ``o_proj``, `RoutedMLP`'s ``down_proj``), which adds it in its epilogue
(`wide.kernels.gemm_k` ``residual=``: to the rounded projection, the bits of transformers' separate add). A
sub-layer that does not take it (its reference path, wide FFN groups as experts) leaves it, and the add runs here as
before. Everything else calls the layer's own forward.

With `KernelOptions.decode_route` too, a batch-1 step goes one further (`closing_gemm`): ``o_proj``'s launch also
writes ``post_attention_layernorm``'s output and the FFN router's decisions, and ``down_proj``'s the next routed
layer's ``input_layernorm`` output and attention decisions (`wide.kernels.gemm_k_route`), so neither norm nor router
launches on its own (`wide.modeling.normroute.hand_over`, `WideLayer.prerouted`); with `decode_route_attn` off
only ``o_proj``'s does, and the next layer's attention norm and router launch as before. A norm or router that does
not qualify (`wide.modeling.normroute.route_weights`) runs as before.
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


def link(layers: list) -> None:
    """``[(decoder layer, its input norm, its WideLayer)]`` in order: each wrapped layer learns the next one's input
    norm and WideLayer (whose attention routing its ``down_proj`` may run, `closing_gemm`)."""
    for (layer, _, _), (_, norm, wl) in zip(layers, layers[1:]):
        if INNER in vars(layer):
            layer._wide_next = (norm, wl)


def closing_gemm(wl, kind: str, x: torch.Tensor, weight: torch.Tensor, mask, plan, x_masked: bool, bias=None):
    """A routed sub-layer's closing reduction-width GEMM (``o_proj``: ``kind`` "attn", ``down_proj``: "ffn"): adds
    the residual the wrapper left, and runs the next norm and router it names in the same launch where they qualify
    (module docstring)."""
    from wide import kernels
    from wide.modeling.normroute import hand_over, route_weights

    residual = wl.pending_residual.pop(kind, None)
    route = wl.pending_route.pop(kind, None)
    if residual is not None and route is not None and bias is None:
        norm, target, sub = route
        slots = target._reads[sub]
        args = route_weights(target, slots[0], residual, norm, rows=1) if len(slots) == 1 else None
        if args is not None:
            weight_n, eps, down, up, rbias, normalize = args
            h, y, decisions = kernels.gemm_k_route(x, weight, mask, residual, weight_n, eps, down, up, rbias,
                                                   normalize=normalize, plan=plan, backend=wl.backend,
                                                   x_masked=x_masked)
            hand_over(norm, h, y)
            target.prerouted[sub] = (h, decisions)
            return h
    return kernels.gemm_k(x, weight, mask, bias=bias, plan=plan, backend=wl.backend, x_masked=x_masked,
                          residual=residual)


def dense_closing(wl, kind: str, x: torch.Tensor, weight: torch.Tensor, bias) -> torch.Tensor:
    """The closing projection of a dense step of a routed model (routing off, `WideRuntime.routing_off`): the
    residual the wrapper left is added by cuBLAS in the same launch (``addmm``, beta = 1: fp32, one rounding; no
    router reads this sum). `wide bench` times the dense baseline this way too, so that both sides have the add in
    the GEMM."""
    residual = wl.pending_residual.pop(kind, None) if bias is None else None
    if residual is None:
        return torch.nn.functional.linear(x, weight, bias)
    n, k = weight.shape
    return torch.addmm(residual.reshape(-1, n), x.reshape(-1, k), weight.t()).view(*x.shape[:-1], n)


def install(layer: nn.Module, wide_layer) -> None:
    """Wraps the decoder ``layer``'s forward (once): qualifying decode steps fuse the residual adds."""
    wrap_forward(layer, INNER, _forward, _wide_residual_layer=wide_layer)


def _forward(self: nn.Module, hidden_states: torch.Tensor, *args, **kwargs):
    from wide.kernels import kernel_options

    wl = self._wide_residual_layer
    if (args or not kernel_options().decode_residual or not wl.use_kernels() or hidden_states.dim() != 3
            or hidden_states.shape[1] != 1 or hidden_states.shape[0] > 64 or torch.compiler.is_compiling()):
        return getattr(self, INNER)(hidden_states, *args, **kwargs)
    route = kernel_options().decode_route and hidden_states.shape[0] == 1
    nxt = getattr(self, "_wide_next", None)
    residual = hidden_states
    h = self.input_layernorm(hidden_states)
    wl.pending_residual["attn"] = residual
    if route:  # o_proj may run this layer's FFN norm and router too
        wl.pending_route["attn"] = (self.post_attention_layernorm, wl, "ffn")
    try:
        h = self.self_attn(hidden_states=h, **kwargs)[0]
    finally:
        left = wl.pending_residual.pop("attn", None)
        wl.pending_route.pop("attn", None)
    if left is not None:  # the attention's o_proj did not take it
        h = residual + h
    residual = h
    h = self.post_attention_layernorm(h)
    wl.pending_residual["ffn"] = residual
    if route and nxt is not None and kernel_options().decode_route_attn:  # down_proj: the next attention's too
        wl.pending_route["ffn"] = (nxt[0], nxt[1], "attn")
    try:
        h = self.mlp(h)
    finally:
        left = wl.pending_residual.pop("ffn", None)
        wl.pending_route.pop("ffn", None)
    return h if left is None else residual + h
