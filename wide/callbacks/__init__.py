"""Lightning callbacks: realized sparsity logging, temperature annealing, trained-tensor checkpoints, throughput."""

from wide.callbacks.checkpoint import WideCheckpoint
from wide.callbacks.sparsity import SparsityMonitor
from wide.callbacks.temperature import TemperatureSchedule
from wide.callbacks.throughput import TokenThroughput

__all__ = ["SparsityMonitor", "TemperatureSchedule", "TokenThroughput", "WideCheckpoint"]
