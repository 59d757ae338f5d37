"""Kernel backends. Importing this package registers ``torch``, ``gather`` and ``triton``."""

from .base import (OPS, KernelBackend, available_backends, get_backend, list_backends,
                   register_backend)
from . import gather, torch_ref, triton_backend  # noqa: F401  (registration)

__all__ = ["OPS", "KernelBackend", "available_backends", "get_backend", "list_backends",
           "register_backend"]
