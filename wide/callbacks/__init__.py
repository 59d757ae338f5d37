"""Lightning callbacks: realized sparsity logging, temperature annealing, trained-tensor checkpoints, throughput,
progress."""

from wide.callbacks.checkpoint import WideCheckpoint
from wide.callbacks.progress import StepProgress
from wide.callbacks.sparsity import SparsityMonitor
from wide.callbacks.temperature import TemperatureSchedule
from wide.callbacks.throughput import TokenThroughput

__all__ = ["SparsityMonitor", "StepProgress", "TemperatureSchedule", "TokenThroughput", "WideCheckpoint"]
