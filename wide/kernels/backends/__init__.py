"""Kernel backends and their registry. Importing this package registers ``torch``, ``gather`` and ``triton``."""

from .base import (AUTO, BACKENDS, OPS, REFERENCE, KernelBackend, auto_order, available_backends, backend_choices,
                   check_backend, get_backend, list_backends, register_backend, unregister_backend)
from . import gather, torch_ref, triton_backend  # noqa: F401,E402  (registration)

__all__ = ["AUTO", "BACKENDS", "OPS", "REFERENCE", "KernelBackend", "auto_order", "available_backends",
           "backend_choices", "check_backend", "get_backend", "list_backends", "register_backend",
           "unregister_backend"]
