"""Stage 1: router calibration with the backbone frozen."""

from __future__ import annotations

from typing import Optional

from wide.config import WideConfig
from wide.tasks.base import WideTask


class RouterCalibration(WideTask):
    """Trains only the routers (backbone frozen) with ``LM + lam * |target - realized skip rate|``.

    Args: see ``WideTask``; the default learning rate is 2e-3.
    """

    stage = "calibrate"

    def __init__(
        self,
        model: str = "smollm2-135m",
        routing: Optional[WideConfig] = None,
        lam: float = 20.0,
        lr: float = 2e-3,
        weight_decay: float = 0.01,
        warmup_ratio: float = 0.1,
        min_lr_ratio: float = 0.0,
        dtype: Optional[str] = None,
        attn_implementation: str = "sdpa",
        gradient_checkpointing: bool = False,
    ):
        super().__init__(model, routing, lam, lr, weight_decay, warmup_ratio, min_lr_ratio, dtype,
                         attn_implementation, gradient_checkpointing)
