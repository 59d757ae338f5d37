"""One-line messages for LightningCLI parse errors: the unknown key of a recipe or a flag, with the closest valid
keys (``wide.registry.suggest``), instead of jsonargparse's usage block and nested union report.

Three shapes of jsonargparse error name an unknown key:

* ``Option 'lamda' is not accepted``, under ``Parser key "model"`` / ``Problem with given class_path 'C'`` lines:
  a key of a class's ``init_args`` (a recipe's ``model.init_args.routing.lamda`` or the same flag);
* ``Subcommand 'fit' does not accept option 'trainer.max_step'``: a recipe key outside the classes;
* ``unrecognized arguments: --data.sorce x``: a flag outside the classes.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from typing import Optional

from wide.registry import suggest

_OPTION = re.compile(r"Option '([^']+)' is not accepted")
_SUBCOMMAND = re.compile(r"Subcommand '([^']+)' does not accept option '([^']+)'")
_UNRECOGNIZED = re.compile(r"unrecognized arguments: (.*)")
_LEVEL = re.compile(r"""Parser key "([^"]+)"|Problem with given class_path '([\w.]+)'""")


def unknown_key(parser, message: str) -> Optional[str]:
    """The one-line error for ``message`` when it names an unknown key, else ``None``."""
    m = _OPTION.search(message)
    if m:
        return _class_option(message[: m.start()], m.group(1))
    m = _SUBCOMMAND.search(message)
    if m:
        return _dotted(m.group(2), _keys(_subparser(parser, m.group(1)) or parser), "key")
    m = _UNRECOGNIZED.search(message)
    if m:
        flags = [t for t in m.group(1).split() if t.startswith("--")]
        if flags:
            bad = flags[0][2:].split("=", 1)[0]
            return _dotted(bad, _keys(parser), "flag", dashes="--")
    return None


def _subparser(parser, name: str):
    action = getattr(parser, "_subcommands_action", None)
    return getattr(action, "_name_parser_map", {}).get(name) if action is not None else None


def _keys(parser) -> list[str]:
    """Every dotted key a parser takes (``trainer.max_steps``, ``data.source``, ``model``...)."""
    keys = []
    for action in parser._actions:
        dest = getattr(action, "dest", None)
        if dest and dest not in ("help", "config", "print_config") and not dest.startswith("=="):
            keys.append(dest)
    return keys


def _dotted(bad: str, keys: list[str], what: str, dashes: str = "") -> str:
    """``bad`` against the dotted ``keys``: the deepest prefix of ``bad`` that exists, then a close child of it."""
    parts = bad.split(".")
    for depth in range(len(parts) - 1, -1, -1):
        prefix = ".".join(parts[:depth])
        children = {k[len(prefix) + 1:].split(".")[0] if prefix else k.split(".")[0]
                    for k in keys if not prefix or k.startswith(prefix + ".")}
        if children:
            shown = f"{dashes}{prefix}." if prefix else dashes
            hint = suggest(parts[depth], sorted(children), prefix=shown)
            where = f"{prefix}: " if prefix else ""
            return f"{dashes}{bad}: unknown {what}.{hint or ' ' + where + 'valid keys: ' + ', '.join(sorted(children))}"
    return f"{dashes}{bad}: unknown {what}"


def _class_option(before: str, bad: str) -> str:
    """An unknown ``init_args`` key: ``before`` is the report up to it; its ``Parser key`` / ``class_path`` lines of
    ever smaller indentation, read backwards, are the path from the top to the class that refused ``bad``."""
    path: list[tuple[str, str]] = []  # ("key", name) or ("class", dotted path), outermost first
    indent = None
    for line in reversed(before.splitlines()):
        m = _LEVEL.search(line)
        if not m:
            continue
        depth = len(line) - len(line.lstrip(" -"))
        if indent is None or depth < indent:
            indent = depth
            path.insert(0, ("key", m.group(1)) if m.group(1) else ("class", m.group(2)))
    levels: list[tuple[str, list[str]]] = []  # (dotted prefix, parameter names), outermost first
    prefix = ""
    for kind, name in path:
        if kind == "key":
            prefix = f"{prefix}.{name}" if prefix else name
            continue
        cls = _import(name)
        if cls is None:
            continue
        if not dataclasses.is_dataclass(cls):
            prefix = f"{prefix}.init_args" if prefix else "init_args"
        levels.append((prefix, _parameters(cls)))
    if not levels:
        return f"{bad}: unknown key"
    where, names = levels[-1]
    full = f"{where}.{bad}"
    for prefix, params in reversed(levels):  # the refusing class first, then the ones around it
        hint = suggest(bad, params, prefix=prefix + ".")
        if hint:
            return f"{full}: unknown key.{hint}"
    return f"{full}: unknown key. Valid keys of {where}: {', '.join(names)}"


def _import(path: str):
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None


def _parameters(cls: type) -> list[str]:
    """The ``__init__`` parameters of ``cls``, following ``**kwargs`` into its bases as jsonargparse does."""
    names: list[str] = []
    for klass in inspect.getmro(cls):
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        try:
            params = list(inspect.signature(init).parameters.values())[1:]
        except (TypeError, ValueError):
            break
        names += [p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name not in names]
        if not any(p.kind == p.VAR_KEYWORD for p in params):
            break
    return names
