"""A small generic registry: names to classes (or factories) of one base type."""

from __future__ import annotations

import difflib
import fnmatch
from typing import Callable, Generic, TypeVar

T = TypeVar("T")


def suggest(name: str, choices, n: int = 3, cutoff: float = 0.5, prefix: str = "") -> str:
    """`` Did you mean 'a', 'b'?`` for the choices closest to ``name`` (empty when none is close): the one
    did-you-mean of every lookup that names what was asked for (registries, assets, tasks, config keys).
    ``prefix`` is shown before each suggestion (a config key's parent, ``model.init_args.``) but not compared."""
    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=n, cutoff=cutoff)
    return f" Did you mean {', '.join(repr(prefix + c) for c in close)}?" if close else ""


class Registry(Generic[T]):
    """Maps names to classes deriving from ``base``.

    Rejects duplicate names and classes of the wrong type, and suggests close names on a miss.

    Args:
        kind: What is registered, used in error messages ("router", "policy", ...).
        base: Every registered class must subclass this.
    """

    def __init__(self, kind: str, base: type):
        self.kind = kind
        self.base = base
        self._items: dict[str, type[T]] = {}

    def register(self, name: str) -> Callable[[type[T]], type[T]]:
        def deco(cls: type[T]) -> type[T]:
            if not (isinstance(cls, type) and issubclass(cls, self.base)):
                raise TypeError(f"{self.kind} {name!r}: {cls!r} does not subclass {self.base.__name__}")
            if name in self._items and self._items[name] is not cls:
                raise ValueError(f"{self.kind} {name!r} is already registered to {self._items[name].__qualname__}")
            self._items[name] = cls
            cls.registered_name = name
            return cls

        return deco

    def get(self, name: str, field: str | None = None) -> type[T]:
        """Looks up ``name``; raises ``ValueError`` naming ``field`` and close names on a miss."""
        try:
            return self._items[name]
        except KeyError:
            hint = suggest(name, self._items)
            where = f"{field}: " if field else ""
            raise ValueError(
                f"{where}unknown {self.kind} {name!r}.{hint} Registered: {', '.join(sorted(self._items))}"
            ) from None

    def unregister(self, name: str) -> type[T]:
        """Removes ``name`` (a throw-away plug-in in a test, say) and returns its class."""
        cls = self.get(name)
        del self._items[name]
        return cls

    def names(self, pattern: str = "*") -> list[str]:
        return sorted(n for n in self._items if fnmatch.fnmatch(n, pattern))

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self):
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)


def import_class_path(path: str, field: str) -> object:
    """The object a ``package.module.Name`` path names (a plug-in given by ``class_path``).

    Raises:
        ValueError: One line naming ``field`` and the path when the module or the name cannot be imported.
    """
    import importlib

    module, _, name = str(path).rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as err:  # ValueError: no module part ("MyRouter")
        hint = "; install its package or put it on PYTHONPATH" if isinstance(err, ImportError) else ""
        raise ValueError(f"{field}: class_path {path!r} cannot be imported ({err}){hint}") from None
