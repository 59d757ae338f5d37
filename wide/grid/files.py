"""Atomic JSON/text files of a grid's output folder, and the durations its progress lines print."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Optional


def write_json(path: Path, data: Any) -> None:
    """Atomic JSON write (temp file + rename)."""
    write_text(path, json.dumps(data, indent=2, default=str) + "\n")


def write_text(path: Path, text: str) -> Path:
    """Atomic text write (temp file + rename); returns ``path``."""
    return write_bytes(path, text.encode())


def write_bytes(path: Path, data: bytes) -> Path:
    """Atomic binary write (temp file + rename); returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return path


def read_json(path: Path) -> Optional[dict[str, Any]]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def duration(seconds: float) -> str:
    """``1h02m03s`` / ``2m03s`` / ``3s``."""
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{s}s")
