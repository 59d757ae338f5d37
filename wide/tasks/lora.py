"""Stage 2: LoRA recovery on top of calibrated routers."""

from __future__ import annotations

from typing import Optional

from torch import nn

import wide
from wide.checkpoint import load_trained, read_metadata
from wide.config import WideConfig
from wide.tasks.base import WideTask

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class LoRARecovery(WideTask):
    """Loads stage-1 routers, adds peft LoRA adapters and trains them (and, by default, the routers).

    The ``WideConfig`` comes from the router checkpoint; ``routing`` is only used when no checkpoint is
    given (training LoRA and routers from scratch).

    Args:
        router_checkpoint: Stage-1 ``.safetensors`` file (or run folder holding ``routers.safetensors``).
        lora_r: LoRA rank.
        lora_alpha: LoRA scaling numerator.
        lora_dropout: Dropout on the LoRA branch.
        lora_targets: Module names to adapt.
        train_routers: Keep training the routers (``False`` freezes them).
        other args: see ``WideTask``; the default learning rate is 2e-4.
    """

    stage = "lora"

    def __init__(
        self,
        model: str = "smollm2-135m",
        router_checkpoint: Optional[str] = None,
        routing: Optional[WideConfig] = None,
        lora_r: int = 16,
        lora_alpha: float = 32.0,
        lora_dropout: float = 0.1,
        lora_targets: Optional[list[str]] = None,
        train_routers: bool = True,
        lr: float = 2e-4,
        **kwargs,
    ):
        if router_checkpoint is not None:
            meta = read_metadata(router_checkpoint)  # fail early on a bad path, before any model load
            if routing is not None and routing != meta["wide_config"]:
                raise ValueError(
                    "routing: differs from the router checkpoint's WideConfig; leave it unset in stage 2 "
                    f"(checkpoint: {meta['wide_config']})"
                )
            routing = meta["wide_config"]
        if not (isinstance(lora_r, int) and lora_r > 0):
            raise ValueError(f"lora_r: must be a positive integer, got {lora_r!r}")
        super().__init__(model, routing, lr=lr, **kwargs)  # the other WideTask arguments pass through
        self.router_checkpoint = router_checkpoint
        self.lora_r = lora_r
        self.lora_alpha = lora_alpha
        self.lora_dropout = lora_dropout
        self.lora_targets = list(lora_targets or LORA_TARGETS)
        self.train_routers = train_routers

    def build_model(self) -> nn.Module:
        from peft import LoraConfig, inject_adapter_in_model

        model = super().build_model()
        if self.router_checkpoint is not None:
            load_trained(model, self.router_checkpoint, prefixes=(".wide.routers.",))
        cfg = LoraConfig(r=self.lora_r, lora_alpha=self.lora_alpha, lora_dropout=self.lora_dropout,
                         target_modules=self.lora_targets, bias="none")
        inject_adapter_in_model(cfg, model)
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.data = p.data.float()  # optimizer state in fp32 even over a bf16 backbone
            p.requires_grad_("lora_" in name or (self.train_routers and ".wide.routers." in f".{name}"))
        return model
