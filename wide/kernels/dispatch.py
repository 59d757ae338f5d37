"""Per-call backend choice: forced (argument or ``WIDE_KERNEL_BACKEND``) or ``auto``; verifiers decide.

``auto`` tries the registered backends that run automatically on the tensors' device type, in their priority
order (`wide.kernels.backends.auto_order`: ``triton`` on CUDA; none elsewhere), and otherwise uses the ``torch``
reference. A chosen backend whose verifier rejects the call (or that is unavailable) falls back to ``torch``.
Every choice is logged once per (op, backend, reason) on the ``wide.kernels`` logger: a fallback at WARNING when
a backend was forced, otherwise at INFO.
"""

from __future__ import annotations

import logging
import os

import torch

from .backends.base import REFERENCE, KernelBackend, auto_order, get_backend

ENV_VAR = "WIDE_KERNEL_BACKEND"

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


def _accepts(impl: KernelBackend, op: str, call: dict) -> tuple[bool, str]:
    if not impl.is_available():
        return False, f"{impl.name} backend unavailable here"
    return impl.verify(op, **call)


def choose(op: str, backend: str | None, call: dict, device: torch.device) -> KernelBackend:
    """Pick the backend object that will run ``op`` for this call."""
    name = requested_backend(backend)
    if name != "auto":
        if name == REFERENCE:
            _log_once(logging.INFO, op, name, "forced")
            return get_backend(REFERENCE)
        impl = get_backend(name, field="backend" if backend and backend != "auto" else ENV_VAR)
        ok, why = _accepts(impl, op, call)
        if ok:
            _log_once(logging.INFO, op, name, "forced")
            return impl
        _log_once(logging.WARNING, op, REFERENCE, f"{name} rejected: {why}")
        return get_backend(REFERENCE)
    candidates = auto_order(device.type)
    if not candidates:
        _log_once(logging.DEBUG, op, REFERENCE, f"auto on {device.type}")
        return get_backend(REFERENCE)
    reasons = []
    for impl in candidates:
        ok, why = _accepts(impl, op, call)
        if ok:
            _log_once(logging.INFO, op, impl.name, "auto")
            return impl
        reasons.append(f"{impl.name} rejected: {why}")
    _log_once(logging.INFO, op, REFERENCE, "; ".join(reasons))
    return get_backend(REFERENCE)
