"""`WideConfig`: what to route, how finely, with which router, and how hard to prune."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Optional, Union

from wide.registry import import_class_path
from wide.routers.base import Router, RouterSpec

TARGETS = ("all", "attention", "ffn")


@dataclass
class WideConfig:
    """Configuration of token-level dynamic width pruning for one model."""

    sparsity: float = 0.5
    """Target skip rate: the fraction of (token, group) units that should be skipped, 0 <= s < 1."""

    attn_sparsity: Optional[float] = None
    """Optional target skip rate for attention routers alone (overrides ``sparsity`` for them)."""

    ffn_sparsity: Optional[float] = None
    """Optional target skip rate for FFN routers alone (overrides ``sparsity`` for them)."""

    sparsity_measure: Literal["kinds", "weight"] = "kinds"
    """What the training target ``sparsity`` measures: ``kinds`` (the paper's: the skip rates of attention and
    FFN averaged equally) or ``weight`` (skipped share of the routed weight work, q+o and gate+up+down
    elements: what inference speed follows). ``weight`` takes the single global target only."""

    targets: Literal["all", "attention", "ffn"] = "all"
    """Which sub-layers are routed: both, only attention (query-head groups) or only the FFN."""

    granularity: str = "width"
    """Registered granularity policy: ``width`` (WIDE), ``sublayer`` (SkipGPT-style) or ``layer`` (MoD-style)."""

    attn_group_size: Optional[int] = None
    """Query heads per attention routing group; must be GQA-aligned. ``None``: the q-heads per KV head."""

    ffn_group_size: int = 64
    """Intermediate channels per FFN routing group; a multiple of 16 that divides the FFN width."""

    router: Union[str, Callable[[RouterSpec], Router]] = "lowrank"
    """Registered router name, or a factory / ``Router`` subclass called once per layer and kind with a ``RouterSpec``."""

    router_rank: int = 32
    """Bottleneck rank of the ``lowrank`` router (hidden width of ``mlp`` is 4x this)."""

    backend: str = "auto"
    """Kernel backend for routed inference: ``auto`` or a registered backend (``torch``, ``gather``, ``triton``,
    plug-ins: `wide.kernels.list_backends()`)."""

    dense_layers: list[int] = field(default_factory=list)
    """Decoder layer indices left unrouted (always dense); negative indices count from the end."""

    def __post_init__(self) -> None:
        for name in ("sparsity", "attn_sparsity", "ffn_sparsity"):
            value = getattr(self, name)
            if value is None and name != "sparsity":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= float(value) < 1.0:
                raise ValueError(f"{name}: target skip rate must be a number in [0, 1), got {value!r}")
            setattr(self, name, float(value))
        if self.sparsity_measure not in ("kinds", "weight"):
            raise ValueError(f"sparsity_measure: must be 'kinds' or 'weight', got {self.sparsity_measure!r}")
        if self.sparsity_measure == "weight" and self.per_kind_targets:
            raise ValueError("sparsity_measure: 'weight' applies the one global target `sparsity`; "
                             "attn_sparsity / ffn_sparsity must then be unset")
        if self.targets not in TARGETS:
            raise ValueError(f"targets: must be one of {TARGETS}, got {self.targets!r}")
        from wide.policies import POLICIES

        if not isinstance(self.granularity, str):
            raise ValueError(f"granularity: must be a registered policy name, got {self.granularity!r}")
        POLICIES.get(self.granularity, field="granularity")
        if self.attn_group_size is not None and not _positive_int(self.attn_group_size):
            raise ValueError(f"attn_group_size: must be a positive integer or None, got {self.attn_group_size!r}")
        if not _positive_int(self.ffn_group_size) or self.ffn_group_size % 16:
            raise ValueError(f"ffn_group_size: must be a positive multiple of 16, got {self.ffn_group_size!r}")
        if isinstance(self.router, str):
            from wide.routers import ROUTERS

            ROUTERS.get(self.router, field="router")
        elif not callable(self.router):
            raise ValueError(f"router: must be a registered name or a callable returning a Router, got {self.router!r}")
        if not _positive_int(self.router_rank):
            raise ValueError(f"router_rank: must be a positive integer, got {self.router_rank!r}")
        from wide.kernels.backends import check_backend

        check_backend(self.backend, field="backend")
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in self.dense_layers):
            raise ValueError(f"dense_layers: must be a list of integers, got {self.dense_layers!r}")
        self.dense_layers = list(self.dense_layers)

    def target_for(self, kind: str) -> float:
        """The target skip rate of one router kind (``attn`` or ``ffn``)."""
        override = self.attn_sparsity if kind == "attn" else self.ffn_sparsity
        return self.sparsity if override is None else override

    @property
    def per_kind_targets(self) -> bool:
        return self.attn_sparsity is not None or self.ffn_sparsity is not None

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict; a callable router is stored by its import path."""
        out = {f: getattr(self, f) for f in self.__dataclass_fields__}
        out["dense_layers"] = list(self.dense_layers)
        if not isinstance(self.router, str):
            out["router"] = _router_to_json(self.router)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "WideConfig":
        data = dict(data)
        router = data.get("router")
        if isinstance(router, dict):
            data["router"] = _router_from_json(router)
        elif isinstance(router, str) and "." in router:
            from wide.routers import ROUTERS

            if router not in ROUTERS:
                data["router"] = import_class_path(router, field="router")
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"WideConfig: unknown field(s) {sorted(unknown)}")
        return cls(**data)


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _router_to_json(router: Any) -> Any:
    """A callable router as ``{"class_path", "init_args"}`` (partials keep their keyword arguments)."""
    import functools

    init_args = {}
    if isinstance(router, functools.partial):
        init_args = dict(router.keywords)
        # jsonargparse wraps the class: partial(instantiate_helper, instantiator, cls, **init_args)
        router = next((a for a in reversed(router.args) if isinstance(a, type)), router.func)
    return {"class_path": f"{router.__module__}.{router.__qualname__}", "init_args": init_args}


def _router_from_json(data: dict[str, Any]) -> Any:
    import functools

    cls = import_class_path(data["class_path"], field="router")
    return functools.partial(cls, **data.get("init_args", {})) if data.get("init_args") else cls
