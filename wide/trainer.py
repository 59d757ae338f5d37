"""The Trainer of the ``wide`` command: Lightning's, with ``precision: auto`` and without Lightning's adverts.

``auto`` picks bf16 only where the hardware computes it natively: on a CPU without AVX-512-BF16 or AMX, bf16
matmuls take a slow emulated path (a 1024x576x1536 matmul: 3.2 s in bf16 against 0.07 s in fp32 on an
AVX2-only CPU), so fp32 is faster there as well as exact.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any, Literal, Optional, Union

import torch
from lightning.fabric.connector import _PRECISION_INPUT
from lightning.pytorch import Trainer
from lightning.pytorch.utilities import rank_zero_info

__all__ = ["WideTrainer", "auto_precision", "cpu_has_native_bf16", "quiet_lightning"]

# /proc/cpuinfo flags of x86 CPUs whose bf16 matmuls run natively (AVX-512-BF16: Cooper Lake, Zen 4 on; AMX:
# Sapphire Rapids on)
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def _cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> set[str]:
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


def cpu_has_native_bf16() -> tuple[bool, str]:
    """Whether this CPU computes bf16 natively, and why (CPU flags and the ISA torch actually dispatches to).

    Both must agree: the flags say what the silicon has, ``torch.backends.cpu.get_cpu_capability()`` what
    torch uses (``ATEN_CPU_CAPABILITY=avx2`` caps it, which emulates an AVX2-only CPU).
    """
    flags = sorted(_cpu_flags() & set(BF16_CPU_FLAGS))
    capability = torch.backends.cpu.get_cpu_capability()
    if flags and capability.upper().startswith(("AVX512", "AMX")):
        return True, f"CPU with {'/'.join(flags)}, torch CPU capability {capability}"
    have = f"CPU flags {'/'.join(flags)}" if flags else "no avx512_bf16/amx_bf16 CPU flag"
    return False, f"{have}, torch CPU capability {capability}: bf16 matmuls would take a slow path"


def _accelerator_kind(accelerator: Any) -> str:
    name = accelerator if isinstance(accelerator, str) else type(accelerator).__name__.lower()
    name = name.lower()
    if name in ("gpu", "cuda") or "cuda" in name:
        return "cuda"
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cpu" if name == "cpu" or "cpu" in name else name


def auto_precision(accelerator: Any = "auto", mixed: str = "bf16-mixed") -> tuple[str, str]:
    """The precision ``auto`` resolves to on ``accelerator``, and why.

    ``mixed`` (``bf16-mixed`` or ``bf16-true``) where bf16 runs natively: CUDA devices of compute capability
    8.0 or more, CPUs with AVX-512-BF16 or AMX; ``32-true`` elsewhere.
    """
    kind = _accelerator_kind(accelerator)
    if kind == "cuda":
        major, minor = torch.cuda.get_device_capability()
        why = f"CUDA device {torch.cuda.get_device_name()} of compute capability {major}.{minor}"
        if (major, minor) >= (8, 0):
            return mixed, f"{why} (>= 8.0: native bf16)"
        return "32-true", f"{why} (< 8.0: no native bf16)"
    if kind == "cpu":
        native, why = cpu_has_native_bf16()
        return (mixed if native else "32-true"), why
    return "32-true", f"accelerator {kind!r}: bf16 support not known to wide"


_NOISE = (
    # LightningCLI warns when `args` is given although `wide` passes exactly sys.argv[1:]
    r"LightningCLI's args parameter is intended",
    # the TensorBoard and CSV loggers share one run folder on purpose (WideCLI aligns their versions)
    r"Experiment logs directory .* exists and is not empty",
    # WideCheckpoint.check_fresh refuses a fit into an earlier run's folder unless resuming or told to overwrite
    r"Checkpoint directory .* exists and is not empty",
    r"Precision .* is not supported by the model summary",
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",  # Lightning 2.6 on torch 2.13, harmless
)


class _NoAdverts(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Tip:" not in str(record.msg)  # Lightning's cloud-logging adverts


def quiet_lightning() -> None:
    """Drops Lightning's adverts ("Tip: ... litlogger") and warnings that do not apply to ``wide`` runs."""
    for pattern in _NOISE:
        warnings.filterwarnings("ignore", message=pattern)
    log = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, _NoAdverts) for f in log.filters):
        log.addFilter(_NoAdverts())


class WideTrainer(Trainer):
    """Lightning's ``Trainer``, whose ``precision`` also takes ``auto``.

    Args:
        precision: Lightning's precision (``32-true``, ``bf16-mixed``, ``bf16-true``, ...), or ``auto``:
            ``bf16-mixed`` where the hardware computes bf16 natively (CUDA compute capability >= 8.0, CPUs
            with AVX-512-BF16 or AMX) and ``32-true`` elsewhere; ``auto-true`` is the same with ``bf16-true``.
            The choice and its reason are printed when the Trainer starts.
    """

    def __init__(self, *, precision: Optional[Union[_PRECISION_INPUT, Literal["auto", "auto-true"]]] = None,
                 **kwargs: Any):
        quiet_lightning()
        if precision in ("auto", "auto-true"):
            mixed = "bf16-true" if precision == "auto-true" else "bf16-mixed"
            precision, why = auto_precision(kwargs.get("accelerator", "auto"), mixed)
            rank_zero_info(f"wide: precision auto -> {precision}: {why}")
        super().__init__(precision=precision, **kwargs)
