"""Kernel backend base class and the small registry the dispatcher reads.

A backend implements some of the routed ops and says, per call, whether it can run it: each op
``name`` has a verifier ``verify_<name>(**call) -> (ok, reason)``. The dispatcher
(`wide.kernels.dispatch`) asks the verifier and falls back to the ``torch`` reference when it says no.
"""

from __future__ import annotations

import difflib
from typing import ClassVar

OPS: tuple[str, ...] = ("gemm_mn", "swiglu", "gemm_k", "attention_prefill", "attention_decode", "router_margin",
                        "coherent_select", "coherent_route")

_BACKENDS: dict[str, type["KernelBackend"]] = {}
_INSTANCES: dict[str, "KernelBackend"] = {}


class KernelBackend:
    """Base class of a routed-op backend.

    Subclasses set ``name``, implement ``is_available`` and, for each op they support, a method named
    like the op plus ``verify_<op>``. Methods receive the public op's arguments already normalized
    (mask as given, ``plan`` possibly ``None``, ``out`` possibly ``None``).
    """

    name: ClassVar[str] = ""
    takes_density: ClassVar[bool] = False
    """Whether ``attention_decode`` takes ``density=`` (the expected mask density, a launch-config hint)."""

    @classmethod
    def is_available(cls) -> bool:
        """Whether this backend can run at all in this process (imports, devices)."""
        return True

    def supports(self, op: str) -> bool:
        return callable(getattr(self, op, None))

    def verify(self, op: str, **call) -> tuple[bool, str]:
        """Ask the op's verifier; a backend without the op or verifier rejects with a reason."""
        if not self.supports(op):
            return False, f"backend {self.name!r} does not implement {op}"
        verifier = getattr(self, f"verify_{op}", None)
        if verifier is None:
            return True, ""
        return verifier(**call)


def register_backend(cls: type[KernelBackend]) -> type[KernelBackend]:
    """Class decorator: add a backend under ``cls.name``; duplicates and non-backends are rejected."""
    if not (isinstance(cls, type) and issubclass(cls, KernelBackend)):
        raise TypeError(f"{cls!r} is not a KernelBackend subclass")
    if not cls.name:
        raise ValueError(f"{cls.__name__} has an empty `name`")
    if cls.name in _BACKENDS and _BACKENDS[cls.name] is not cls:
        raise ValueError(f"kernel backend {cls.name!r} is already registered by {_BACKENDS[cls.name].__name__}")
    _BACKENDS[cls.name] = cls
    return cls


def get_backend(name: str) -> KernelBackend:
    """The (cached) instance of a registered backend; unknown names get a did-you-mean hint."""
    if name not in _BACKENDS:
        close = difflib.get_close_matches(name, list(_BACKENDS), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise KeyError(f"unknown kernel backend {name!r} (registered: {', '.join(sorted(_BACKENDS))}){hint}")
    if name not in _INSTANCES:
        _INSTANCES[name] = _BACKENDS[name]()
    return _INSTANCES[name]


def list_backends() -> list[str]:
    """Names of all registered backends, available or not."""
    return sorted(_BACKENDS)


def available_backends() -> list[str]:
    """Names of registered backends whose ``is_available()`` is true here."""
    return [n for n in list_backends() if _BACKENDS[n].is_available()]
