"""The self-distillation teacher: the student's own backbone with routing off and LoRA disabled.

No second copy of the weights: the same modules run twice per step, once as the teacher (every head and
channel executes, no router is called, adapters bypassed, no autograd graph) and once as the routed student.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn

from wide.modeling.wrap import runtime_of

__all__ = ["adapters_disabled", "teacher_mode"]


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """Bypasses every peft adapter layer of ``model`` (a no-op without any).

    peft's ``PeftModel.disable_adapter()`` is not available here: stage 2 injects LoRA into the HF model in place
    (``inject_adapter_in_model``), without a ``PeftModel`` around it. Its per-layer switch ``enable_adapters``
    also rewrites the adapters' ``requires_grad`` (and sets it back to ``True`` on re-enabling), which must not
    change between a data-parallel step's forward and backward (DDP buckets, FSDP2's sharded parameters), so only
    the flag that layers' ``forward`` reads (``disable_adapters``) is toggled.
    """
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    before = [m._disable_adapters for m in layers]
    for m in layers:
        m._disable_adapters = True
    try:
        yield
    finally:
        for m, flag in zip(layers, before):
            m._disable_adapters = flag


@contextlib.contextmanager
def teacher_mode(model: nn.Module) -> Iterator[None]:
    """The dense teacher: routing off (`WideRuntime.routing_off`: no router runs, every mask executes, nothing is
    recorded, so the routed student's sparsity stats are untouched), adapters bypassed, and no grad.

    Dropout layers keep the model's mode (LoRA dropout is bypassed with the adapters; the supported backbones'
    attention dropout is 0 in their configs)."""
    with runtime_of(model).routing_off(), adapters_disabled(model), torch.no_grad():
        yield
