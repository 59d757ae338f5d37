"""Fused glue: ``torch.compile`` the small elementwise ops HF runs between the projections.

A decode step of an HF Llama / Qwen layer launches ~40 kernels, most of them tiny elementwise ones: the
two RMS norms (cast, square, mean, rsqrt, scale: ~7 launches each), RoPE on q and k (~10) and the MLP's
activation times up projection. On an H200 they are about half of a dense batch-1 decode step of a
Llama-3.1-8B-shaped model even under a CUDA graph, and the same on the routed model, which caps the
routed speed-up. ``fuse_glue`` compiles exactly those regions, each on its own (no graph breaks, one
compiled graph shared by every layer, seconds to compile), and leaves everything else eager, so a CUDA
graph of the whole step captures them as usual.

What is compiled (each is the module's or architecture's own code, so the numbers do not change):

- every ``*RMSNorm`` module of a ``transformers.models`` architecture (forward of its class);
- ``apply_rotary_pos_emb`` of each attention module's architecture file, which the attention forward
  looks up there at call time (so the compiled function serves every model of that architecture in
  the process; it is the same function);
- every plain dense ``*MLP`` module (forward of its class: act(gate) * up fuses into one kernel, the
  projections stay cuBLAS calls). With routed kernels a routed model's MLP runs the fused ``swiglu`` kernel
  instead; on the reference path (training, or kernels off) a routed SiLU MLP gets ``silu(gate) ⊙ mask ⊙ up`` as
  one compiled function (`routed_silu_glue`), forward and backward, the mask's straight-through gradient included.

In training the same regions save most of a step's elementwise memory traffic (HF's fp32 RMS norm alone is ~6
kernels forward and more backward over ``[B, T, D]``; the masked SwiGLU ~5 passes over ``[B, T, F]`` each way):
the training tasks take ``fuse_glue: true`` (`wide.tasks.base.WideTask`).

Run one forward per input shape outside stream capture before capturing (compiles happen on first use).
"""

from __future__ import annotations

import sys
import types
from typing import Callable, Optional

import torch
from torch import nn

_COMPILED: dict[tuple[Callable, str], Callable] = {}
RECOMPILE_LIMIT = 64
"""Dynamo's per-function recompile limit while glue is fused (torch's default: 8). One compiled norm / RoPE serves
every layer at every shape the model runs, and dynamo specialises sizes 0 / 1 apart from larger ones: prefill and
decode, batch 1 and larger, the dense and routed sides, calibration forwards — on 2026-12-02 a SmolLM2 and an 8B
bench hit 8 (`--no-overlap-routing`, low-rank routers), which under ``fullgraph=True`` is a hard failure."""
_ROPE = "apply_rotary_pos_emb"
_INNER = "_wide_inner_forward"  # `wide.modeling.normroute.INNER`: the forward under a routed norm's wrapper


def _compiled(fn: Callable, backend: str) -> Callable:
    """One compiled wrapper per original function (and backend), shared by every module that runs it."""
    key = (fn, backend)
    if key not in _COMPILED:
        import torch._dynamo.config as dynamo_config

        dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, RECOMPILE_LIMIT)
        out = torch.compile(fn, fullgraph=True, backend=backend)
        out._wide_original = fn  # also marks a module forward as fused (a bound method shows its attributes)
        out._wide_backend = backend  # (inductor rounds a fused pointwise chain once: `wide.kernels.decode_qkv`)
        _COMPILED[key] = out
    return _COMPILED[key]


_ROPE_ORIGINALS: dict[str, object] = {}
"""An architecture file's own ``apply_rotary_pos_emb`` object while its compiled function stands in (`unfuse_glue`)."""


def _rope_function(rope: object) -> Optional[Callable]:
    """The plain function behind an architecture's ``apply_rotary_pos_emb``, or ``None``.

    transformers >= 5.2x with the ``kernels`` package installed turns it into a small ``nn.Module`` (so a hub kernel can
    replace it per model) whose forward calls the original function, held in the forward's closure; compiling that
    module would trace its kernel dispatch, so the function itself is compiled. ``None`` (RoPE left eager) when the
    wrapper holds no such function.
    """
    if isinstance(rope, types.FunctionType):
        return rope
    forward = getattr(type(rope), "forward", None) if isinstance(rope, nn.Module) else None
    for cell in getattr(forward, "__closure__", None) or ():
        value = cell.cell_contents
        if isinstance(value, types.FunctionType) and value.__name__ == _ROPE:
            return value
    return None


def _hf_class(module: nn.Module, suffix: str) -> bool:
    cls = type(module)
    return cls.__module__.startswith("transformers.models.") and cls.__name__.endswith(suffix)


def routed_silu_glue(gate: torch.Tensor, up: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
    """``(silu(gate) ⊙ mask expanded over its groups) ⊙ up``: a routed MLP's reference glue, in the order
    `MaskedActivation` computes it (``mask`` ``[..., G]`` float or bool, or ``None``: no routing this forward)."""
    from wide.modeling.layer import mask_channels

    return mask_channels(torch.nn.functional.silu(gate), mask) * up


def _routed_silu_mlp(module: nn.Module) -> bool:
    """An HF gated MLP whose activation `apply_wide` masked, around a SiLU (Llama / Qwen / Mistral)."""
    from wide.modeling.layer import MaskedActivation

    act = getattr(module, "act_fn", None)
    return (_hf_class(module, "MLP") and isinstance(act, MaskedActivation)
            and type(act.act).__name__ in ("SiLU", "SiLUActivation")
            and all(hasattr(module, n) for n in ("gate_proj", "up_proj", "down_proj")))


def _routed_mlp_forward(backend: str):
    glue = _compiled(routed_silu_glue, backend)

    def forward(self, x):
        # the projections stay modules (peft's LoRA wrappers, FSDP2's hooks), only the glue between them is compiled
        return self.down_proj(glue(self.gate_proj(x), self.up_proj(x), self.act_fn.wide_layer.ffn_mask))

    forward._wide_original = None  # marks the instance forward as fused (`unfuse_glue` removes it)
    return forward


def _plain_mlp(module: nn.Module) -> bool:
    """An HF gated MLP of plain linears and a stock activation (a routed reference MLP masks its activation
    with wide's own module: `_routed_silu_mlp`)."""
    act = getattr(module, "act_fn", None)
    return (_hf_class(module, "MLP") and act is not None
            and type(act).__module__.startswith(("transformers.", "torch.nn."))
            and all(type(getattr(module, n, None)) is nn.Linear for n in ("gate_proj", "up_proj", "down_proj")))


def fuse_glue(model: nn.Module, backend: str = "inductor") -> dict[str, int]:
    """Compiles a model's RMS norms, RoPE and dense MLP glue in place (see the module docstring).

    Idempotent (what is fused stays fused, with the backend it got first); the parameters, state-dict keys
    and outputs do not change.

    Args:
        model: An HF causal LM, routed or not.
        backend: ``torch.compile`` backend. ``inductor`` generates Triton kernels on a GPU (C++ on a CPU, which
            needs a compiler); ``aot_eager`` traces the same graphs without generating code (tests).

    Returns:
        How many modules / functions were fused: ``{"norm": n, "rope": r, "mlp": m}`` (``mlp``: dense MLPs and
        routed reference MLPs).
    """
    counts = {"norm": 0, "rope": 0, "mlp": 0}
    for module in model.modules():
        if _routed_silu_mlp(module):
            if not hasattr(module.forward, "_wide_original"):
                module.forward = types.MethodType(_routed_mlp_forward(backend), module)
            counts["mlp"] += 1
            continue
        kind = "norm" if _hf_class(module, "RMSNorm") else "mlp" if _plain_mlp(module) else None
        if kind is not None:
            # a norm whose forward `enable_kernels` wrapped (`wide.modeling.normroute`) gets the compiled forward
            # under the wrapper, which stays outermost
            wrapped = _INNER in vars(module)
            if not hasattr(getattr(module, _INNER) if wrapped else module.forward, "_wide_original"):
                compiled = types.MethodType(_compiled(type(module).forward, backend), module)
                setattr(module, _INNER if wrapped else "forward", compiled)
            counts[kind] += 1
        elif _hf_class(module, "Attention"):
            arch_module = sys.modules[type(module).__module__]
            rope = getattr(arch_module, _ROPE, None)
            if rope is None:
                continue
            if not hasattr(rope, "_wide_original"):
                fn = _rope_function(rope)
                if fn is None:
                    continue
                _ROPE_ORIGINALS[arch_module.__name__] = rope
                setattr(arch_module, _ROPE, _compiled(fn, backend))
            counts["rope"] += 1
    return counts


def unfuse_glue(model: nn.Module) -> None:
    """Puts the eager forwards back (RoPE included, for every model of the architectures ``model`` uses)."""
    for module in model.modules():
        if "forward" in vars(module) and hasattr(module.forward, "_wide_original"):
            del module.forward  # the instance attribute: the class forward shows through again
        if hasattr(vars(module).get(_INNER), "_wide_original"):
            setattr(module, _INNER, types.MethodType(type(module).forward, module))
        if _hf_class(module, "Attention"):
            arch_module = sys.modules[type(module).__module__]
            rope = getattr(arch_module, _ROPE, None)
            if rope is not None and hasattr(rope, "_wide_original"):
                setattr(arch_module, _ROPE, _ROPE_ORIGINALS.pop(arch_module.__name__, rope._wide_original))
