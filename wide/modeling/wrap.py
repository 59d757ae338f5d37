"""`apply_wide`: route a Hugging Face causal LM in place."""

from __future__ import annotations

import functools
from typing import Optional

import torch
from torch import nn

from wide.config import WideConfig
from wide.modeling.architectures import ArchSpec, arch_for, get_path
from wide.modeling.attention import base_name, routed_name
from wide.modeling.layer import MaskedActivation, WideLayer
from wide.modeling.runtime import SparsityStats, WideRuntime
from wide.policies import POLICIES, LayerShape, Policy
from wide.routers import ROUTERS, RouterSpec


def _text_config(config):
    get = getattr(config, "get_text_config", None)
    return get() if get is not None else config


def layer_shapes(model: nn.Module) -> list[LayerShape]:
    cfg = _text_config(model.config)
    n = cfg.num_hidden_layers
    heads, kv = cfg.num_attention_heads, getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return [LayerShape(i, n, cfg.hidden_size, heads, kv, head_dim, cfg.intermediate_size) for i in range(n)]


def _group_scores(layer: nn.Module, arch: ArchSpec, kind: str, group_size: int, head_dim: int):
    """Lazy ``[G, D]`` column-norm matrix for training-free routers (see ``TopKRouter``)."""

    def compute() -> torch.Tensor:
        with torch.no_grad():
            if kind == "attn":
                w = _weight(get_path(layer, f"{arch.attn}.{arch.q_proj}"))
                rows = group_size * head_dim
                norm = get_path(layer, arch.attn_norm)
            else:
                w = torch.cat([_weight(get_path(layer, f"{arch.mlp}.{p}")) for p in (arch.gate_proj, arch.up_proj)])
                rows = group_size
                norm = get_path(layer, arch.ffn_norm)
            w = w.float()
            if kind == "ffn":
                n_inter = w.shape[0] // 2
                gate, up = w[:n_inter], w[n_inter:]
                w = torch.stack([gate.unflatten(0, (-1, rows)), up.unflatten(0, (-1, rows))], 1).flatten(1, 2)
                col = w.pow(2).sum(1).sqrt()  # [G, D]
            else:
                col = w.unflatten(0, (-1, rows)).pow(2).sum(1).sqrt()
            gain = norm.forward(torch.ones(  # .forward: no routing hooks
                1, w.shape[-1], device=w.device, dtype=next(norm.parameters()).dtype)).float()
            return col * gain.reshape(1, -1).abs()

    return compute


def _weight(module: nn.Module) -> torch.Tensor:
    base = getattr(module, "base_layer", module)  # peft-wrapped linears keep the original weight here
    return base.weight


def _build_router(cfg: WideConfig, spec: RouterSpec) -> nn.Module:
    factory = ROUTERS.get(cfg.router, field="router") if isinstance(cfg.router, str) else cfg.router
    router = factory(spec)
    from wide.routers import Router

    if not isinstance(router, Router):
        raise TypeError(f"router: the factory returned {type(router).__name__}, not a wide.routers.Router")
    return router


def _valid_tokens(args, kwargs) -> tuple[Optional[torch.Tensor], Optional[int]]:
    ids = kwargs.get("input_ids", args[0] if args else None)
    embeds = kwargs.get("inputs_embeds")
    src = ids if ids is not None else embeds
    t = src.shape[1] if src is not None else None
    am = kwargs.get("attention_mask")
    # a 2D padding mask tells the valid tokens; prepared 4D masks (or per-layer-type dicts, as
    # generate builds for static caches) do not, and then every token counts
    if not isinstance(am, torch.Tensor) or am.dim() != 2 or t is None:
        return None, t
    return am[:, -t:].bool(), t


def apply_wide(model: nn.Module, config: Optional[WideConfig] = None) -> nn.Module:
    """Routes ``model`` in place and returns it.

    Every decoder layer (except ``config.dense_layers``) gets routers (the only new parameters, in
    float32 on the model's device), its attention output is masked per query-head group through a
    routed twin of its attention implementation, and its MLP activation is replaced by a masked one.
    All original parameters are frozen; ``nn.Linear`` modules stay where they are, so peft can still
    target ``q_proj`` … ``down_proj``.

    Args:
        model: A supported Hugging Face causal LM (``llama``, ``mistral``, ``qwen2``, ``qwen3``, ``gemma3_text``).
        config: The routing configuration (default ``WideConfig()``).

    Raises:
        ValueError: naming the bad field, before anything is changed.
    """
    cfg = config if config is not None else WideConfig()
    if not isinstance(cfg, WideConfig):
        raise ValueError(f"config: expected a WideConfig, got {type(cfg).__name__}")
    if getattr(model, "wide_runtime", None) is not None:
        raise ValueError("model: already routed by wide.apply_wide")
    arch = arch_for(getattr(model, "config", None))
    policy: Policy = POLICIES.get(cfg.granularity, field="granularity")()
    shapes = layer_shapes(model)
    n = len(shapes)
    dense = set()
    for i in cfg.dense_layers:
        if not -n <= i < n:
            raise ValueError(f"dense_layers: index {i} is out of range for {n} layers")
        dense.add(i % n)
    for shape in shapes:  # validate everything before touching the model
        policy.validate(shape, cfg)
    layers = get_path(model, arch.layers)
    ref = next(model.parameters())
    runtime = WideRuntime()

    for p in model.parameters():
        p.requires_grad_(False)

    for shape, layer in zip(shapes, layers):
        if shape.layer_idx in dense:
            continue
        slots = policy.slots(shape, cfg)
        routers = {}
        for slot in slots:
            scores = None
            if len(slot.gates) == 1 and slot.group_size:
                scores = _group_scores(layer, arch, slot.gates[0], slot.group_size, shape.head_dim)
            spec = RouterSpec(slot.kind, shape.layer_idx, n, shape.hidden_size, slot.num_groups, slot.group_size,
                              policy.target_sparsity(slot, cfg), cfg.router_rank, scores, slot.gates)
            routers[slot.kind] = _build_router(cfg, spec).to(device=ref.device, dtype=torch.float32)
        wl = WideLayer(shape.layer_idx, slots, routers, policy, runtime).train(model.training)
        wl.routed_weights = {"attn": 2 * shape.num_heads * shape.head_dim * shape.hidden_size,
                             "ffn": 3 * shape.intermediate_size * shape.hidden_size}
        layer.wide = wl
        runtime.layers.append(wl)
        attn = get_path(layer, arch.attn)
        object.__setattr__(attn, "_wide_layer", wl)
        get_path(layer, arch.attn_norm).register_forward_pre_hook(
            functools.partial(_route_hook, wl, "attn"), with_kwargs=True)
        if "ffn" in wl.gating:
            mlp = get_path(layer, arch.mlp)
            setattr(mlp, arch.act, MaskedActivation(getattr(mlp, arch.act), wl).train(model.training))
        if wl.decides_at("ffn"):
            get_path(layer, arch.ffn_norm).register_forward_pre_hook(
                functools.partial(_route_hook, wl, "ffn"), with_kwargs=True)

    text_cfg = _text_config(model.config)
    text_cfg._attn_implementation = routed_name(text_cfg._attn_implementation)
    if text_cfg is not model.config:
        model.config._attn_implementation = text_cfg._attn_implementation
    owner = get_path(model, arch.layers.rsplit(".", 1)[0]) if "." in arch.layers else model
    owner.register_forward_pre_hook(functools.partial(_begin_hook, runtime, text_cfg), with_kwargs=True)
    model.wide_runtime = runtime
    model.wide_config = cfg
    model.wide_arch = arch
    return model


def _begin_hook(runtime: WideRuntime, text_cfg, module, args, kwargs):
    # users may switch attention implementations after apply_wide; keep the routed twin in place
    impl = text_cfg._attn_implementation
    if not (impl or "").startswith("wide_"):
        text_cfg._attn_implementation = routed_name(impl)
    valid, tokens = _valid_tokens(args, kwargs)
    runtime.begin_forward(valid, tokens, masked=kwargs.get("attention_mask") is not None)


def _route_hook(wl: WideLayer, kind: str, module, args, kwargs):
    residual = args[0] if args else next(iter(kwargs.values()))
    if kind == "attn":
        wl.route_attention(residual, module)
    else:
        wl.route_ffn(residual, module)


def is_routed(model: nn.Module) -> bool:
    return getattr(model, "wide_runtime", None) is not None


def runtime_of(model: nn.Module) -> WideRuntime:
    rt = getattr(model, "wide_runtime", None)
    if rt is None:
        inner = getattr(model, "base_model", None)  # peft PeftModel -> LoraModel -> HF model
        while rt is None and inner is not None and inner is not model:
            rt = getattr(inner, "wide_runtime", None)
            model, inner = inner, getattr(inner, "model", None)
    if rt is None:
        raise ValueError("model: not routed; call wide.apply_wide(model, config) first")
    return rt


def sparsity_stats(model: nn.Module) -> Optional[SparsityStats]:
    """Realized routing of the model's last forward (``None`` before the first)."""
    return runtime_of(model).stats()


def set_temperature(model: nn.Module, tau: float) -> None:
    """Sets the Gumbel-softmax temperature used by all routers in training mode."""
    if not tau > 0:
        raise ValueError(f"tau: must be > 0, got {tau!r}")
    runtime_of(model).tau = float(tau)


def router_parameters(model: nn.Module):
    """The routers' parameters (named), in layer order."""
    for name, p in model.named_parameters():
        if ".wide.routers." in f".{name}":
            yield name, p


def unwrap_attention_name(model: nn.Module) -> str:
    return base_name(_text_config(model.config)._attn_implementation)
