"""Build the model to evaluate: dense, training-free routed, or routed from a `wide fit` checkpoint."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import nn

import wide
from wide.config import WideConfig

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_MODEL = "smollm2-135m"
DEFAULT_LORA_ALPHA = 32.0  # LoRARecovery's default; used when a checkpoint does not record its alpha
_LORA_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<ab>[AB])\.(?P<adapter>[^.]+)\.weight$")


@dataclass
class LoadedModel:
    """What ``load_model`` built.

    Attributes:
        model: The HF causal LM in eval mode, routed unless dense, LoRA merged into its weights.
        tokenizer: Its tokenizer.
        info: JSON-safe description: model name, resolved path, method, routing config, checkpoint
            metadata (stage, step), LoRA settings, dtype, device.
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
    """Short method label: ``dense``, ``width/lowrank``, ``layer/lowrank``, ``width/topk`` ..."""
    if cfg is None:
        return "dense"
    router = cfg.router if isinstance(cfg.router, str) else cfg.to_dict()["router"].rsplit(".", 1)[-1]
    return f"{cfg.granularity}/{router}"


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
      applied, LoRA adapters are injected (as ``LoRARecovery`` does) when the file holds LoRA tensors,
      the tensors are loaded after the identity check, and LoRA is merged into the base weights.

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
        merge_lora: Merge LoRA into the weights and drop the adapters (as for deployment).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from wide.assets import resolve_model
    from wide.checkpoint import load_trained, read_metadata

    if checkpoint is not None and routing is not None:
        raise ValueError("routing: a checkpoint carries its own WideConfig; give either a checkpoint or routing flags")
    meta = read_metadata(checkpoint) if checkpoint is not None else None
    if model is None:
        model = (meta or {}).get("extra", {}).get("model") or DEFAULT_MODEL
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    path = resolve_model(model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, attn_implementation=attn_implementation)
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
    if cfg is not None:
        wide.apply_wide(lm, cfg)
    if meta is not None:
        lora = _lora_settings(meta["path"], meta, lora_alpha)
        if lora is not None:
            _inject_lora(lm, lora)
        load_trained(lm, meta["path"])
        if lora is not None and merge_lora:
            _merge_lora(lm)
        info["checkpoint"] = {"path": meta["path"], "stage": meta["stage"], "step": meta["step"],
                              "extra": meta["extra"], "lora": lora, "lora_merged": lora is not None and merge_lora}
    elif cfg is not None and not _training_free(lm):
        log.warning("routing: router %r is learnable and no checkpoint was given; it is evaluated at its random "
                    "init (pass --checkpoint from `wide fit` for a calibrated router)", info["method"])
        info["untrained_router"] = True
    lm.eval()
    return LoadedModel(lm, tokenizer, info)


def _training_free(model: nn.Module) -> bool:
    """True when no router has parameters (``topk``): nothing to calibrate."""
    return not any(True for _ in wide.router_parameters(model))


def _lora_settings(path: str, meta: dict[str, Any], lora_alpha: Optional[float]) -> Optional[dict[str, Any]]:
    """LoRA rank and targets from the tensor shapes; alpha from the metadata, the flag, or the default."""
    from safetensors import safe_open

    ranks, targets = set(), set()
    with safe_open(path, framework="pt") as f:
        for key in f.keys():
            m = _LORA_KEY.match(key)
            if m and m["ab"] == "A":
                ranks.add(f.get_slice(key).get_shape()[0])
                targets.add(m["module"].rsplit(".", 1)[-1])
    if not ranks:
        return None
    if len(ranks) > 1:
        raise ValueError(f"checkpoint: LoRA adapters of mixed ranks {sorted(ranks)} are not supported")
    extra = meta.get("extra", {})
    recorded = extra.get("lora_alpha", extra.get("lora", {}).get("alpha") if isinstance(extra.get("lora"), dict) else None)
    if recorded is not None:
        alpha, source = float(recorded), "checkpoint"
        if lora_alpha is not None and float(lora_alpha) != alpha:
            raise ValueError(f"lora_alpha: the checkpoint records {alpha}, got {lora_alpha}")
    elif lora_alpha is not None:
        alpha, source = float(lora_alpha), "flag"
    else:
        alpha, source = DEFAULT_LORA_ALPHA, "default"
        log.warning("checkpoint: LoRA alpha is not recorded in %s; assuming %s (LoRARecovery's default). "
                    "Pass --lora-alpha if the run used another value.", path, alpha)
    return {"r": ranks.pop(), "alpha": alpha, "alpha_source": source, "targets": sorted(targets)}


def _inject_lora(model: nn.Module, lora: dict[str, Any]) -> None:
    from peft import LoraConfig, inject_adapter_in_model

    cfg = LoraConfig(r=lora["r"], lora_alpha=lora["alpha"], lora_dropout=0.0, target_modules=lora["targets"],
                     bias="none")
    inject_adapter_in_model(cfg, model)
    for p in model.parameters():
        p.requires_grad_(False)


def _merge_lora(model: nn.Module) -> None:
    """Folds every LoRA delta into its base ``nn.Linear`` and puts the plain linear back in place."""
    from peft.tuners.lora import LoraLayer

    for name, module in list(model.named_modules()):
        if not isinstance(module, LoraLayer):
            continue
        module.merge()
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, module.get_base_layer())
