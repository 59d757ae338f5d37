"""Lightning callbacks: realized sparsity logging, temperature annealing, the end-of-fit rate calibration,
trained-tensor checkpoints, throughput, progress, REP-LIE pruning."""

from wide.callbacks.checkpoint import WideCheckpoint
from wide.callbacks.progress import StepProgress
from wide.callbacks.rate import RateCalibration
from wide.callbacks.rep_lie import RepLiePruning
from wide.callbacks.sparsity import SparsityMonitor
from wide.callbacks.temperature import TemperatureSchedule
from wide.callbacks.throughput import TokenThroughput

__all__ = ["RateCalibration", "RepLiePruning", "SparsityMonitor", "StepProgress", "TemperatureSchedule",
           "TokenThroughput", "WideCheckpoint"]
