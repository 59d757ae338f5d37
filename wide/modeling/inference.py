"""Routed inference: run eval-mode forwards through `wide.kernels` (export and reload: `wide.io.folder`).

``enable_kernels(model)`` turns the reference path (dense compute, masked outputs) into routed
execution. Per routed layer it:

- replaces ``q_proj`` by an output-width routed linear (``gemm_mn``: skipped head groups are never
  computed) and ``o_proj`` by a reduction-width routed linear (``gemm_k``); on CUDA decode steps the attention
  router runs on a side stream while the dense ``k_proj`` / ``v_proj`` (`EarlyLinear`), which the routed
  ``q_proj`` launches first, run on the main one (`set_overlap_routing`);
- runs attention through ``attention_prefill`` / ``attention_decode`` for the active head groups
  (plain causal attention over a complete cache; padded batches, sliding windows and soft-capping
  keep the reference path);
- replaces the MLP by one that runs ``swiglu`` (gate and up under one mask, one pass over x) and
  ``gemm_k`` for ``down_proj`` (SiLU-gated MLPs; others keep the reference path); groups of at least
  `wide.kernels.experts.EXPERT_MIN_GROUP` channels go through ``ffn_experts`` instead (prefill: as experts);
- wraps the forward of each norm a router reads before (Llama / Qwen RMSNorms): with
  ``KernelOptions.decode_norm_route`` a decode step computes its output with the router (`wide.modeling.normroute`);
- wraps the forward of each routed Llama / Qwen2 attention: with ``KernelOptions.decode_qkv`` a decode step over a
  static cache runs q / k / v, RoPE and the cache write in one launch (`wide.modeling.fused_attention`);
- wraps the forward of each Llama / Qwen2 decoder layer: with ``KernelOptions.decode_residual`` a decode step adds
  the residual stream in the epilogues of ``o_proj`` / ``down_proj`` (`wide.modeling.fused_residual`).

One routing plan per layer and kind is built once per forward and shared by the paired ops. K/V
projections stay dense, so HF caches (dynamic or static) work unchanged. State-dict keys do not
change. The kernels run only in eval mode: training always uses the autograd reference path.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from wide.modeling import fused_attention, fused_residual
from wide.modeling.architectures import ArchSpec, get_path
from wide.modeling.layer import MaskedActivation, WideLayer
from wide.modeling.normroute import install as install_norm_route
from wide.modeling.normroute import is_plain_rms_norm
from wide.modeling.wrap import runtime_of


class _LinearView(nn.Module):
    """Holds an ``nn.Linear``'s own ``weight`` / ``bias`` parameters (state-dict keys unchanged) and the module."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.weight = linear.weight
        self.bias = linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features
        object.__setattr__(self, "original", linear)

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}"


class RoutedLinear(_LinearView):
    """A linear layer whose eval-mode forward is a routed kernel; same ``weight``/``bias`` parameters.

    Args:
        linear: The ``nn.Linear`` to take the parameters from.
        wide_layer: The layer whose current mask drives it.
        kind: Router kind of the mask (``attn`` or ``ffn``).
        mode: ``mn`` (output columns routed) or ``k`` (input columns routed).
    """

    def __init__(self, linear: nn.Linear, wide_layer: WideLayer, kind: str, mode: str):
        super().__init__(linear)
        self.kind, self.mode = kind, mode
        object.__setattr__(self, "wide_layer", wide_layer)
        object.__setattr__(self, "early", ())  # EarlyLinear siblings to run first while the router decides

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wl = self.wide_layer
        if not wl.use_kernels() or self.kind not in wl.group_mask:
            if self.mode == "k" and wl.use_kernels() and not wl.runtime.routing:
                return fused_residual.dense_closing(wl, self.kind, x, self.weight, self.bias)
            return F.linear(x, self.weight, self.bias)
        from wide import kernels

        if wl.routing_pending:
            # the router still runs on the side stream: queue the dense K/V projections of the same input first,
            # so they run beside it, then wait for its mask (`kernel_mask` joins)
            for lin in self.early:
                lin.run_early(x)
        mask, plan = wl.kernel_mask(self.kind)
        if self.mode == "mn":
            return kernels.gemm_mn(x, self.weight, mask, bias=self.bias, plan=plan, backend=wl.backend)
        # o_proj after this layer's routed attention: its input is already zero in the skipped heads, so the
        # GEMM needs no masking pass (a launch and a read + write of x per prefill layer)
        zeroed = self.kind == "attn" and wl.take_heads_zeroed()
        # `wide.modeling.fused_residual`: a decode step's residual add (and the next norm and router) in the epilogue
        return fused_residual.closing_gemm(wl, self.kind, x, self.weight, mask, plan, zeroed, self.bias)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, kind={self.kind}, mode={self.mode}"


class EarlyLinear(_LinearView):
    """A dense linear (K / V projection) that the routed q projection may run ahead of its own call: the next
    call with the same input tensor returns that result (same parameters, same ``F.linear``: the same values);
    any other call computes as usual."""

    def __init__(self, linear: nn.Linear):
        super().__init__(linear)
        self._early: Optional[tuple[torch.Tensor, torch.Tensor]] = None

    def run_early(self, x: torch.Tensor) -> None:
        self._early = (x, F.linear(x, self.weight, self.bias))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        early, self._early = self._early, None
        if early is not None and early[0] is x:
            return early[1]
        return F.linear(x, self.weight, self.bias)


class RoutedMLP(nn.Module):
    """A gated MLP whose eval-mode forward is ``gemm_k(swiglu(x, gate, up, mask), down, mask)``.

    Holds the original children under their original names (state-dict keys unchanged).
    """

    def __init__(self, mlp: nn.Module, wide_layer: WideLayer, arch: ArchSpec):
        super().__init__()
        for name, child in mlp.named_children():
            self.add_module(name, child)
        self.names = (arch.gate_proj, arch.up_proj, arch.down_proj, arch.act)
        object.__setattr__(self, "wide_layer", wide_layer)
        object.__setattr__(self, "original", mlp)
        gate, up, down, act = (getattr(self, n) for n in self.names)
        inner = act.act if isinstance(act, MaskedActivation) else act
        plain = all(type(m) is nn.Linear and m.bias is None for m in (gate, up, down))
        silu = isinstance(inner, nn.SiLU) or type(inner).__name__ == "SiLUActivation"
        self.fused = plain and silu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up, down, act = (getattr(self, n) for n in self.names)
        wl = self.wide_layer
        if self.fused and wl.use_kernels() and "ffn" in wl.group_mask:
            from wide import kernels
            from wide.kernels import experts

            mask, plan = wl.kernel_mask("ffn")
            if gate.weight.shape[0] // mask.shape[-1] >= experts.EXPERT_MIN_GROUP:
                # wide groups: one op, whose backend may run them as experts (grouped GEMMs, fixed-order combine)
                return kernels.ffn_experts(x, gate.weight, up.weight, down.weight, mask, plan=plan, backend=wl.backend)
            h = kernels.swiglu(x, gate.weight, up.weight, mask, plan=plan, backend=wl.backend)
            # swiglu wrote exact zeros for skipped channels: gemm_k need not mask x again; a decode step's residual
            # (`wide.modeling.fused_residual`) is added in its epilogue
            return fused_residual.closing_gemm(wl, "ffn", h, down.weight, mask, plan, True)
        if self.fused and wl.use_kernels() and not wl.runtime.routing:  # a dense decode step may fuse its add
            return fused_residual.dense_closing(wl, "ffn", act(gate(x)) * up(x), down.weight, None)
        return down(act(gate(x)) * up(x))


def _routed_layers(model: nn.Module):
    arch: ArchSpec = model.wide_arch
    for layer in get_path(model, arch.layers):
        wl = getattr(layer, "wide", None)
        if wl is not None:
            yield layer, wl, arch


def enable_kernels(model: nn.Module, backend: Optional[str] = None) -> nn.Module:
    """Runs eval-mode forwards of a routed model through ``wide.kernels`` (see the module docstring).

    Also turns off HF ``generate``'s automatic ``torch.compile`` of static-cache decoding (see the comment).

    Args:
        model: A model routed by ``apply_wide``; adapters (LoRA), if any, are merged first.
        backend: ``auto`` (triton on CUDA, torch elsewhere), ``torch``, ``gather`` or ``triton``;
            ``None`` takes ``WideConfig.backend``.
    """
    from wide.io.adapters import merge_adapters

    runtime_of(model)
    backend = backend or model.wide_config.backend
    merge_adapters(model)  # the routed kernels replace plain nn.Linear modules only
    gen_cfg = getattr(model, "generation_config", None)
    if gen_cfg is not None:
        # HF generate compiles the whole forward by itself for a static cache on a GPU; over the routed ops'
        # graph breaks (~8 per layer, frames recompiled per layer) that takes minutes on large models and then
        # falls back to eager past dynamo's recompile limit. Decode with CUDA graphs through `wide.generate`,
        # or set ``model.generation_config.disable_compile = False`` to let HF try.
        gen_cfg.disable_compile = True
    for layer, wl, arch in _routed_layers(model):
        wl.backend = backend
        wl.kernels_enabled = True
        for sub, path in (("attn", arch.attn_norm), ("ffn", arch.ffn_norm)):
            norm = get_path(layer, path)
            if wl.decides_at(sub) and is_plain_rms_norm(norm):  # `KernelOptions.decode_norm_route`'s seam
                install_norm_route(norm)
        attn = get_path(layer, arch.attn)
        if "attn" in wl.gating:
            for name, mode in ((arch.q_proj, "mn"), (arch.o_proj, "k")):
                lin = getattr(attn, name)
                if type(lin) is nn.Linear:
                    setattr(attn, name, RoutedLinear(lin, wl, "attn", mode))
            # K / V projections the routed q projection launches ahead while a decode step's router runs on a
            # side stream (`WideLayer.route_attention`)
            for name in (arch.k_proj, arch.v_proj):
                lin = getattr(attn, name, None)
                if type(lin) is nn.Linear:
                    setattr(attn, name, EarlyLinear(lin))
            q, early = getattr(attn, arch.q_proj), [getattr(attn, n, None) for n in (arch.k_proj, arch.v_proj)]
            if isinstance(q, RoutedLinear) and all(isinstance(m, EarlyLinear) for m in early):
                object.__setattr__(q, "early", tuple(early))
                wl.early_kv = True
            if fused_attention.supported(attn):  # `KernelOptions.decode_qkv`'s seam
                fused_attention.install(attn, wl)
        if fused_residual.supported(layer):  # `KernelOptions.decode_residual`'s seam
            fused_residual.install(layer, wl)
        mlp = get_path(layer, arch.mlp)
        if "ffn" in wl.gating and not isinstance(mlp, RoutedMLP):
            parent, _, attr = arch.mlp.rpartition(".")
            setattr(get_path(layer, parent) if parent else layer, attr, RoutedMLP(mlp, wl, arch))
    fused_residual.link([(layer, get_path(layer, arch.attn_norm), wl) for layer, wl, arch in _routed_layers(model)])
    return model


def set_kernels(model: nn.Module, enabled: bool) -> None:
    """Switches kernel execution on or off without unwrapping (off: the reference path)."""
    for _, wl, _ in _routed_layers(model):
        wl.kernels_enabled = enabled


def set_overlap_routing(model: nn.Module, enabled: bool) -> None:
    """Whether routed CUDA decode steps decide the attention mask on a side stream, beside the dense K/V
    projections (on by default; off: one stream, the router before the q projection). Same outputs either way."""
    runtime_of(model).overlap_routing = bool(enabled)


def set_coherent_decode(model: nn.Module, refresh_every: Optional[int] = 1, memory: float = 0.0,
                        keep: str = "router", keep_scale: float = 1.0) -> None:
    """Turns batch-coherent decode routing on (``refresh_every`` steps, EMA ``memory``, ``keep`` rule and its
    ``keep_scale``: see `wide.policies.CoherentDecode`) or off (``None``)."""
    from wide.policies.coherent import CoherentDecode

    rt = runtime_of(model)
    rt.coherent = None if refresh_every is None else CoherentDecode(refresh_every, memory, keep, keep_scale)
    for wl in rt.layers:
        wl.reset_decode_state()
