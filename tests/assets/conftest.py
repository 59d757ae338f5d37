"""Every asset test runs against its own empty cache."""

import pytest


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("WIDE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"
