"""Model loading: device and dtype resolution, and the dense, training-free routed or checkpointed model."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import nn

from wide.config import WideConfig
from wide.io.adapters import ADAPTERS, inject_adapter, merge_adapters, read_adapters
from wide.io.checkpoint import load_trained, read_metadata
from wide.modeling.wrap import apply_wide, router_parameters

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_MODEL = "smollm2-135m"


def pretrained_lm(path: Any, **kwargs: Any) -> nn.Module:
    """``AutoModelForCausalLM.from_pretrained(path, **kwargs)`` with Hugging Face hub kernels off.

    Where the ``kernels`` package is installed, transformers (>= 5.2x) loads a model with ``use_kernels`` on by
    default: every ``train()`` / ``eval()`` switch then re-kernelizes its norms and functions, which replaces the
    forwards ``apply_wide``, ``fuse_glue`` and the routed kernels set on those modules (Lightning switches modes at
    every validation), and a hub kernel would be fetched from the network. wide owns those forwards, so its loads
    keep transformers' own code.
    """
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, use_kernels=False, **kwargs)


@dataclass
class LoadedModel:
    """What ``load_model`` built.

    Attributes:
        model: The HF causal LM in eval mode, routed unless dense, adapters (LoRA, sparse) merged into its weights.
        tokenizer: Its tokenizer.
        info: JSON-safe description: model name, resolved path, method, routing config, checkpoint
            metadata (stage, step), adapter (name, settings, label) and LoRA settings, dtype, device.
    """

    model: nn.Module
    tokenizer: Any
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device


def resolve_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: {device!r} requested but CUDA is not available")
    return dev


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``auto``: bfloat16 on CUDA, float32 elsewhere."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"dtype: must be auto or one of {sorted(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


def describe_routing(cfg: Optional[WideConfig]) -> str:
    """Short method label: ``dense``, ``width/lowrank``, ``layer/lowrank``, ``width/topk``, ``width/MyRouter``
    (a plug-in router given by class path: its class name) ..."""
    if cfg is None:
        return "dense"
    if isinstance(cfg.router, str):
        return f"{cfg.granularity}/{cfg.router}"
    return f"{cfg.granularity}/{cfg.to_dict()['router']['class_path'].rsplit('.', 1)[-1]}"


def load_model(
    model: Optional[str] = None,
    *,
    checkpoint: Optional[str] = None,
    routing: Optional[WideConfig] = None,
    device: str = "auto",
    dtype: str = "auto",
    attn_implementation: str = "sdpa",
    lora_alpha: Optional[float] = None,
    merge_lora: bool = True,
) -> LoadedModel:
    """Loads a causal LM for evaluation.

    * ``model`` alone: the dense model.
    * ``routing``: ``apply_wide`` with that config, nothing loaded (training-free routers such as
      ``topk``; a learnable router without a checkpoint stays at its random init, with a warning).
    * ``checkpoint``: a trained-tensor file from ``wide fit`` (stage 1 or 2). Its ``WideConfig`` is
      applied, its adapter (``lora``, ``super``, ``supra``, ...) is injected as ``LoRARecovery`` did when the
      file holds adapter tensors, the tensors (sparse supports included) are loaded after the identity check,
      and the adapter is merged into the base weights.

    Args:
        model: Asset name, local folder or hub name; default: the model the checkpoint was trained
            on, else ``smollm2-135m``.
        checkpoint: ``.safetensors`` file or a folder holding ``routers.safetensors``.
        routing: Routing for a model without checkpoint (mutually exclusive with ``checkpoint``).
        device: ``auto`` (CUDA if present), ``cpu``, ``cuda``, ``cuda:1`` ...
        dtype: ``auto`` (bfloat16 on CUDA, float32 on CPU), ``float32``, ``bfloat16``, ``float16``.
            Routers stay in float32 whatever the backbone dtype.
        attn_implementation: HF attention implementation of the backbone.
        lora_alpha: LoRA alpha for checkpoints that do not record it (default 32, LoRARecovery's).
        merge_lora: Merge the adapter (of any kind) into the weights and drop it (as for deployment).
    """
    from transformers import AutoTokenizer

    from wide.assets import resolve_model

    if checkpoint is not None and routing is not None:
        raise ValueError("routing: a checkpoint carries its own WideConfig; give either a checkpoint or routing flags")
    meta = read_metadata(checkpoint) if checkpoint is not None else None
    if model is None:
        model = (meta or {}).get("extra", {}).get("model") or DEFAULT_MODEL
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    path = resolve_model(model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    lm = pretrained_lm(path, dtype=torch_dtype, attn_implementation=attn_implementation)
    lm.to(dev)
    lm.config.use_cache = False
    cfg = meta["wide_config"] if meta is not None else routing
    info: dict[str, Any] = {
        "model": model,
        "model_path": str(path),
        "method": describe_routing(cfg),
        "routing": cfg.to_dict() if cfg is not None else None,
        "checkpoint": None,
        "dtype": str(torch_dtype).removeprefix("torch."),
        "device": str(dev),
        "attn_implementation": attn_implementation,
    }
    if meta is not None:
        info["checkpoint"] = apply_checkpoint(lm, meta, lora_alpha=lora_alpha, merge_lora=merge_lora)
    elif cfg is not None:
        apply_wide(lm, cfg)
    if meta is None and cfg is not None and not _training_free(lm):
        log.warning("routing: router %r is learnable and no checkpoint was given; it is evaluated at its random "
                    "init (pass --checkpoint from `wide fit` for a calibrated router)", info["method"])
        info["untrained_router"] = True
    lm.eval()
    return LoadedModel(lm, tokenizer, info)


def apply_checkpoint(model: nn.Module, checkpoint: Any, *, lora_alpha: Optional[float] = None,
                     merge_lora: bool = True) -> dict[str, Any]:
    """Makes a dense ``model`` the checkpoint's routed model: ``apply_wide`` with its ``WideConfig``, its adapter
    (stage 2: ``lora``, ``super``, ``supra``, ...) injected as ``LoRARecovery`` did, every trained tensor loaded after
    the identity check, and the adapter merged into the base weights (``merge_lora``, as deployed). What ``wide eval``,
    ``wide bench`` and ``wide export`` all load a ``wide fit`` output with.

    Args:
        checkpoint: ``.safetensors`` file, a folder holding ``routers.safetensors``, or its ``read_metadata`` dict.
        lora_alpha: LoRA alpha for checkpoints that do not record it (default 32, LoRARecovery's).

    Returns:
        The checkpoint's summary: path, stage, step, extra, the LoRA settings (``None`` without), the adapter
        (name, label, settings) and whether it was merged.
    """
    meta = checkpoint if isinstance(checkpoint, dict) else read_metadata(checkpoint)
    apply_wide(model, meta["wide_config"])
    adapters = read_adapters(meta["path"], meta["extra"], alpha=lora_alpha)  # at most one
    adapter = None
    for name, settings in adapters.items():
        inject_adapter(model, name, settings)
        adapter = {"name": name, "label": ADAPTERS.get(name)().describe(settings), **settings}
    if adapters:
        for p in model.parameters():
            p.requires_grad_(False)
    load_trained(model, meta["path"])
    if adapters and merge_lora:
        merge_adapters(model)
    return {"path": meta["path"], "stage": meta["stage"], "step": meta["step"], "extra": meta["extra"],
            "lora": adapters.get("lora"), "adapter": adapter, "adapter_merged": adapter is not None and merge_lora}


def _training_free(model: nn.Module) -> bool:
    """True when no router has parameters (``topk``): nothing to calibrate."""
    return not any(True for _ in router_parameters(model))
