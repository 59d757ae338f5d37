"""Where built assets live: ``$WIDE_CACHE`` (default ``~/.cache/wide``), one folder per asset with a manifest."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from wide.assets.catalog import get_asset

CACHE_ENV = "WIDE_CACHE"
MANIFEST = "wide_asset.json"
BUILD_FORMAT = 1  # bump when the build of an asset changes, so older cached builds are redone


def cache_dir() -> Path:
    """The asset and token cache root: ``$WIDE_CACHE`` or ``~/.cache/wide``."""
    return Path(os.environ.get(CACHE_ENV) or "~/.cache/wide").expanduser()


def asset_path(name: str) -> Path:
    """Where the built asset lives (or will live) in the cache."""
    info = get_asset(name)
    return cache_dir() / ("models" if info.kind == "model" else "data") / info.name


def is_cached(name: str) -> bool:
    """Whether ``name`` is built in the cache, from the pinned source, by this build format."""
    info = get_asset(name)
    manifest = asset_path(name) / MANIFEST
    if not manifest.is_file():
        return False
    try:
        meta = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return False
    return meta.get("sha256") == info.sha256 and meta.get("format") == BUILD_FORMAT


def install(out: Path, target: Path, *, force: bool) -> None:
    """Move a finished build into place with renames only, so readers never see a partial one."""
    target.parent.mkdir(parents=True, exist_ok=True)
    old = None
    if target.exists():
        if not force and (target / MANIFEST).is_file() and is_cached(target.name):
            return  # another process finished first; keep its build
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.replace(target, old)
    try:
        os.replace(out, target)
    except OSError:
        if not is_cached(target.name):  # lost a race to another process: fine if its build is whole
            raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
