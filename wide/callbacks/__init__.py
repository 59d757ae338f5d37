"""Lightning callbacks: realized sparsity logging, temperature annealing, trained-tensor checkpoints."""

from wide.callbacks.checkpoint import WideCheckpoint
from wide.callbacks.sparsity import SparsityMonitor
from wide.callbacks.temperature import TemperatureSchedule

__all__ = ["SparsityMonitor", "TemperatureSchedule", "WideCheckpoint"]
