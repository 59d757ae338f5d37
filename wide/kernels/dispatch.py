"""Per-call backend choice: forced (argument or ``WIDE_KERNEL_BACKEND``) or ``auto``; verifiers decide.

``auto`` tries ``triton`` for CUDA tensors and otherwise uses ``torch``. A chosen backend whose
verifier rejects the call (or that is unavailable) falls back to ``torch``. Every choice is logged
once per (op, backend, reason) on the ``wide.kernels`` logger: a fallback at WARNING when a backend was
forced, otherwise at INFO.
"""

from __future__ import annotations

import logging
import os

import torch

from .backends.base import KernelBackend, get_backend

ENV_VAR = "WIDE_KERNEL_BACKEND"
REFERENCE = "torch"

logger = logging.getLogger("wide.kernels")
_logged: set[tuple[str, str, str]] = set()


def _log_once(level: int, op: str, backend: str, reason: str) -> None:
    key = (op, backend, reason)
    if key in _logged:
        return
    _logged.add(key)
    logger.log(level, "wide.kernels.%s -> %s%s", op, backend, f" ({reason})" if reason else "")


def reset_log_cache() -> None:
    """Forget which choices were logged (tests)."""
    _logged.clear()


def requested_backend(backend: str | None) -> str:
    """The backend name a call asks for: the argument unless it is ``auto``, then the env variable."""
    name = backend or "auto"
    if name == "auto":
        name = os.environ.get(ENV_VAR, "").strip() or "auto"
    return name


def choose(op: str, backend: str | None, call: dict, device: torch.device) -> KernelBackend:
    """Pick the backend object that will run ``op`` for this call."""
    name = requested_backend(backend)
    forced = name != "auto"
    if not forced:
        name = "triton" if device.type == "cuda" else REFERENCE
    if name == REFERENCE:
        _log_once(logging.DEBUG if not forced else logging.INFO, op, name,
                  "forced" if forced else f"auto on {device.type}")
        return get_backend(REFERENCE)
    impl = get_backend(name)
    if not impl.is_available():
        ok, why = False, f"{name} backend unavailable here"
    else:
        ok, why = impl.verify(op, **call)
    if ok:
        _log_once(logging.INFO, op, name, "forced" if forced else "auto")
        return impl
    _log_once(logging.WARNING if forced else logging.INFO, op, REFERENCE, f"{name} rejected: {why}")
    return get_backend(REFERENCE)
