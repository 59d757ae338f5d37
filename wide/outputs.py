"""Output paths checked before any compute: every command that writes names its bad flag in one line at once,
instead of failing after minutes of work (a file where a folder is expected, a parent it cannot write into, a
result it would overwrite)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Optional


def _writable_parent(path: Path, flag: str) -> None:
    """Raises unless the nearest existing ancestor of ``path`` is a folder this process can write into."""
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(f"{flag}: {parent} is a file, so {path} cannot be created under it")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise ValueError(f"{flag}: cannot write into {parent} (permission denied); pick another {flag}")
            return


def check_output_dir(path: str | os.PathLike, flag: str, *, results: Optional[Iterable[str]] = None,
                     force: bool = False, force_flag: str = "--force") -> Path:
    """Checks a folder a command will write into; returns it resolved.

    Args:
        path: The folder (created later by the command).
        flag: The flag that gave it, named in the errors (``--output``).
        results: Names of the files the command writes into it: one already there is refused unless ``force``.
            ``None``: the folder itself must be absent or empty unless ``force``; ``()``: anything there is kept
            (resumable outputs).
        force: Whether the command may replace what is there.
        force_flag: The flag that sets ``force``, named in the error.

    Raises:
        ValueError: One line naming ``flag``.
    """
    out = Path(path).expanduser().resolve()
    if out.exists() and not out.is_dir():
        raise ValueError(f"{flag}: {out} is a file; {flag} takes a folder (the command writes files into it)")
    _writable_parent(out, flag)
    if out.is_dir():
        if not os.access(out, os.W_OK | os.X_OK):
            raise ValueError(f"{flag}: cannot write into {out} (permission denied)")
        if not force:
            if results is None and any(out.iterdir()):
                raise ValueError(f"{flag}: {out} exists and is not empty (pass {force_flag} to replace it)")
            there = [name for name in results or () if (out / name).exists()]
            if there:
                raise ValueError(f"{flag}: {out} already holds {', '.join(there)} (pass {force_flag} to overwrite, "
                                 f"or pick another {flag})")
    return out


def check_output_file(path: str | os.PathLike, flag: str) -> Path:
    """Checks a file a command will write (replacing an older one); returns it resolved.

    Raises:
        ValueError: One line naming ``flag`` when ``path`` is a folder or its folder cannot be written.
    """
    out = Path(path).expanduser().resolve()
    if out.is_dir():
        raise ValueError(f"{flag}: {out} is a folder; {flag} takes a file name")
    _writable_parent(out, flag)
    if out.exists() and not os.access(out, os.W_OK):
        raise ValueError(f"{flag}: cannot overwrite {out} (permission denied)")
    return out
