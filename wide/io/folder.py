"""Model folders: ``export`` a routed model (adapters merged) as a folder that ``load`` restores, ready to generate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch
from torch import nn

from wide.io.adapters import merge_adapters
from wide.io.checkpoint import load_trained, read_metadata, save_trained
from wide.modeling.inference import enable_kernels
from wide.modeling.wrap import apply_wide

ROUTERS_FILE = "routers.safetensors"


def export(model: nn.Module, path: str | Path, tokenizer=None) -> Path:
    """Saves a routed model as a folder that ``wide.load`` restores, ready for ``generate``.

    Adapters (LoRA) are merged into the base weights first. The folder holds the HF config and
    weights (safetensors, router tensors excluded), ``routers.safetensors`` (routers + metadata:
    WideConfig and the base model's identity) and the tokenizer when given.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    merge_adapters(model)
    # (row-major copies of column-major weights, `wide.modeling.layout`: safetensors writes contiguous tensors)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if ".wide." not in f".{k}"}
    model.save_pretrained(path, state_dict=state, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    save_trained(model, path / ROUTERS_FILE, config=model.wide_config, stage="export")
    (path / "wide.json").write_text(json.dumps({"wide_config": model.wide_config.to_dict()}, indent=2))
    return path


def load(path: str | Path, *, dtype: Optional[torch.dtype] = None, device: Optional[str] = None,
         kernels: bool = True, backend: Optional[str] = None, fuse_glue: bool | str = False,
         weight_layout: str = "row") -> nn.Module:
    """Restores a folder written by ``export`` onto its HF architecture: routed, eval mode, ready to generate.

    Args:
        path: The exported folder.
        dtype: Weights dtype (default: as saved).
        device: Where to put the model (default: CPU).
        kernels: Route eval forwards through ``wide.kernels`` (``enable_kernels``).
        backend: Kernel backend (default: the exported ``WideConfig.backend``).
        fuse_glue: Compile the RMS norms and RoPE (`wide.modeling.fuse.fuse_glue`): fewer, fused launches
            per decode step; the first forward at each new shape compiles. ``True`` uses inductor; a string
            names another ``torch.compile`` backend.
        weight_layout: ``"row"`` (as saved) or ``"column"``: ``o_proj`` / ``down_proj`` stored column-major for the
            routed decode GEMVs (`wide.set_weight_layout`; measured slower than row-major on an H100, for A/Bs).
    """
    from wide.io.loading import pretrained_lm
    from wide.modeling.layout import check_layout, set_weight_layout

    check_layout(weight_layout, "weight_layout")  # before any weights load
    path = Path(path)
    meta = read_metadata(path / ROUTERS_FILE)
    model = pretrained_lm(path, dtype=dtype or "auto")
    if device is not None:
        model.to(device)
    apply_wide(model, meta["wide_config"])
    load_trained(model, path / ROUTERS_FILE)
    model.eval()
    if kernels:
        enable_kernels(model, backend)
    set_weight_layout(model, weight_layout)
    if fuse_glue:
        from wide.modeling.fuse import fuse_glue as fuse

        fuse(model, "inductor" if fuse_glue is True else fuse_glue)
    return model
