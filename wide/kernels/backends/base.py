"""Kernel backend base class and the backend registry.

A backend implements some of the routed ops and says, per call, whether it can run it: each op ``name`` has a
verifier ``verify_<name>(**call) -> (ok, reason)``. Its class also says where ``backend="auto"`` may pick it
(``auto_devices``) and before which others (``priority``). One registration (`register_backend`) drives everything
that lists backends: `WideConfig.backend` validation (`check_backend`), the ``wide bench --backend`` choices
(`backend_choices`) and ``auto``'s order (`auto_order`). The dispatcher (`wide.kernels.dispatch`) asks the verifiers
and falls back to the ``torch`` reference when none says yes.
"""

from __future__ import annotations

from typing import ClassVar

from wide.registry import Registry, suggest

OPS: tuple[str, ...] = ("gemm_mn", "swiglu", "gemm_k", "ffn_experts", "attention_prefill", "attention_decode",
                        "router_margin", "coherent_select", "coherent_route", "rms_norm_route", "decode_qkv",
                        "gemm_k_route")
AUTO = "auto"
REFERENCE = "torch"
"""The reference backend: runs every op (autograd, float masks); every rejected call falls back to it."""


class KernelBackend:
    """Base class of a routed-op backend.

    Subclasses set ``name``, implement ``is_available`` and, for each op they support, a method named
    like the op plus ``verify_<op>``. Methods receive the public op's arguments already normalized
    (mask as given, ``plan`` possibly ``None``, ``out`` possibly ``None``).
    """

    name: ClassVar[str] = ""
    auto_devices: ClassVar[tuple[str, ...]] = ()
    """Device types (``"cuda"``, ``"cpu"``, ...) on which ``backend="auto"`` tries this backend; empty: only when
    forced by name."""
    priority: ClassVar[int] = 0
    """``auto``'s order among the backends of a device type: the highest first (ties: by name)."""
    takes_residual: ClassVar[bool] = False
    """Whether ``gemm_k`` takes ``residual=`` (adds it in its epilogue); for the others the public op adds it."""
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


BACKENDS: Registry[KernelBackend] = Registry("kernel backend", KernelBackend)
_INSTANCES: dict[str, KernelBackend] = {}
_AUTO_ORDER: dict[str, tuple[KernelBackend, ...]] = {}  # device type -> auto's candidates (the reference excluded)


def register_backend(cls: type[KernelBackend]) -> type[KernelBackend]:
    """Class decorator: add a backend under ``cls.name``; duplicates and non-backends are rejected."""
    if not (isinstance(cls, type) and issubclass(cls, KernelBackend)):
        raise TypeError(f"{cls!r} is not a KernelBackend subclass")
    if not cls.name or cls.name == AUTO:
        raise ValueError(f"{cls.__name__}: `name` must be a non-empty name other than {AUTO!r}, got {cls.name!r}")
    BACKENDS.register(cls.name)(cls)
    _INSTANCES.pop(cls.name, None)
    _AUTO_ORDER.clear()
    return cls


def unregister_backend(name: str) -> type[KernelBackend]:
    """Remove a registered backend (a throw-away plug-in in a test); the reference cannot be removed."""
    if name == REFERENCE:
        raise ValueError(f"the reference backend {REFERENCE!r} cannot be unregistered")
    cls = BACKENDS.unregister(name)
    _INSTANCES.pop(name, None)
    _AUTO_ORDER.clear()
    return cls


def get_backend(name: str, field: str | None = None) -> KernelBackend:
    """The (cached) instance of a registered backend; unknown names get a did-you-mean hint naming ``field``."""
    impl = _INSTANCES.get(name)
    if impl is None:
        impl = _INSTANCES[name] = BACKENDS.get(name, field)()
    return impl


def list_backends() -> list[str]:
    """Names of all registered backends, available or not."""
    return BACKENDS.names()


def available_backends() -> list[str]:
    """Names of registered backends whose ``is_available()`` is true here."""
    return [n for n in BACKENDS.names() if BACKENDS.get(n).is_available()]


def backend_choices() -> list[str]:
    """What a ``backend`` setting may name: ``auto`` and every registered backend."""
    return [AUTO, *BACKENDS.names()]


def check_backend(name: str, field: str = "backend") -> str:
    """``name`` if it is a valid backend setting, else one error naming ``field`` (with close names)."""
    if name != AUTO and name not in BACKENDS:
        choices = backend_choices()
        raise ValueError(f"{field}: unknown kernel backend {name!r}.{suggest(name, choices)} "
                         f"Choices: {', '.join(choices)}")
    return name


def auto_order(device_type: str) -> tuple[KernelBackend, ...]:
    """The backends ``auto`` tries on tensors of ``device_type``, in order (highest ``priority`` first); the
    reference, the fallback of every call, is not among them."""
    order = _AUTO_ORDER.get(device_type)
    if order is None:
        names = [n for n in BACKENDS.names() if n != REFERENCE and device_type in BACKENDS.get(n).auto_devices]
        names.sort(key=lambda n: -BACKENDS.get(n).priority)  # stable: ties stay by name
        order = _AUTO_ORDER[device_type] = tuple(get_backend(n) for n in names)
    return order
