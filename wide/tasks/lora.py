"""Stage 2: LoRA recovery on top of calibrated routers."""

from __future__ import annotations

from typing import Optional

from torch import nn

from wide.config import WideConfig
from wide.io.adapters import DEFAULT_LORA_ALPHA, LoRA, inject_adapter
from wide.io.checkpoint import load_trained, read_metadata
from wide.io.loading import DEFAULT_MODEL
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
        model: str = DEFAULT_MODEL,
        router_checkpoint: Optional[str] = None,
        routing: Optional[WideConfig] = None,
        lora_r: int = 16,
        lora_alpha: float = DEFAULT_LORA_ALPHA,
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
        model = super().build_model()
        if self.router_checkpoint is not None:
            load_trained(model, self.router_checkpoint, prefixes=(".wide.routers.",))
        inject_adapter(model, "lora", {"r": self.lora_r, "alpha": self.lora_alpha, "dropout": self.lora_dropout,
                                       "targets": self.lora_targets})
        for name, p in model.named_parameters():
            lora = LoRA.marker in name
            if lora:
                p.data = p.data.float()  # optimizer state in fp32 even over a bf16 backbone
            p.requires_grad_(lora or (self.train_routers and ".wide.routers." in f".{name}"))
        return model
