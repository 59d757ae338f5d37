"""Weight layouts of the reduction-width routed linears (``o_proj``, ``down_proj``) for routed inference.

A reduction-width routed GEMM (`wide.kernels.gemm_k`) skips column groups of its weight ``[N, K]``: the input
channels of a skipped head group or FFN channel group. Stored row-major (PyTorch's layout), a decode step's GEMV
then reads every output row in short runs, one per active group (256 bytes for an FFN group of 128 bf16 channels),
and (the hypothesis this layout tested) half of every DRAM page it opens goes unread. Stored column-major
(``weight.t().contiguous().t()``: same logical tensor, strides ``(1, N)``), each active group is one contiguous block
of ``group x N`` elements, as a dense GEMV's weight is. Measured on an H100 (2026-12-07, BENCHMARKS.md): slower, not
faster — the 8B batch-1 decode step at 50% 4.40 ms column-major against 4.25 ms row-major, every swept column-major
GEMV config behind the row-major default — so row-major is the default and this layout stays for A/Bs.

`set_weight_layout(model, "column")` re-lays those weights in place, one at a time (a weight's copy at a time of
extra memory), keeping the same ``nn.Parameter`` objects: state-dict keys, LoRA merges and the dense path
(``F.linear``, cuBLAS takes either layout) are unchanged. A state dict of a column-major model holds non-contiguous
tensors: `wide.export` writes row-major copies (``safetensors`` needs contiguous tensors). The triton backend picks
its gemm_k configs by layout (`wide.kernels.triton.gemm_k.column_major`).

No library re-lays a routed model's weights for us: transformers' and torch's layouts are row-major throughout.
"""

from __future__ import annotations

from typing import Iterator

import torch
from torch import nn

LAYOUTS = ("row", "column")


def _reduction_weights(model: nn.Module) -> Iterator[nn.Parameter]:
    """The weights a routed layer passes to gemm_k: ``o_proj`` of routed attention, ``down_proj`` of a routed
    FFN (each once)."""
    from wide.modeling.architectures import get_path

    arch = model.wide_arch
    seen: set[int] = set()
    for layer in get_path(model, arch.layers):
        wl = getattr(layer, "wide", None)
        if wl is None:
            continue
        found = []
        if "attn" in wl.gating:
            found.append(getattr(get_path(layer, arch.attn), arch.o_proj).weight)
        if "ffn" in wl.gating:
            found.append(getattr(get_path(layer, arch.mlp), arch.down_proj).weight)
        for w in found:
            if id(w) not in seen:
                seen.add(id(w))
                yield w


def weight_layout(weight: torch.Tensor) -> str:
    """``"column"`` for a column-major ``[N, K]`` weight (strides ``(1, N)``, what the triton gemm_k configs key on),
    else ``"row"``."""
    from wide.kernels.triton.common import column_major  # (no Triton import)

    return "column" if column_major(weight) else "row"


def check_layout(layout: str, field: str = "layout") -> str:
    """``layout`` if it is one of `LAYOUTS`; else one error naming ``field``."""
    if layout not in LAYOUTS:
        raise ValueError(f"{field}: one of {', '.join(LAYOUTS)}, got {layout!r}")
    return layout


def set_weight_layout(model: nn.Module, layout: str) -> int:
    """Stores the weights of every routed layer's reduction-width linears (``o_proj``, ``down_proj``) in
    ``layout`` (``"row"`` or ``"column"``, see the module docstring), in place; returns how many were re-laid.

    Call it before capturing CUDA graphs (a `wide.Generator`'s, `wide bench`'s runners): the weights move to new
    storage, and a graph captured before would still read the old one.

    Raises:
        ValueError: ``layout`` is neither, or ``model`` is not routed (`wide.apply_wide` first).
    """
    check_layout(layout)
    if getattr(model, "wide_arch", None) is None:
        raise ValueError("set_weight_layout: the model is not routed (call wide.apply_wide first)")
    changed = 0
    with torch.no_grad():
        for w in _reduction_weights(model):
            if weight_layout(w) == layout or w.shape[0] == 1 or w.shape[1] == 1:
                continue
            w.data = w.data.t().contiguous().t() if layout == "column" else w.data.contiguous()
            changed += 1
    return changed
