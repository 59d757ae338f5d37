"""LightningModules for the two training stages."""

from wide.tasks.base import WideTask
from wide.tasks.calibration import RouterCalibration
from wide.tasks.lora import LoRARecovery

__all__ = ["LoRARecovery", "RouterCalibration", "WideTask"]
