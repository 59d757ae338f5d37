"""Quality evaluation: perplexity on held-out prose and lm-eval-style zero-shot accuracy.

``wide eval`` (see :mod:`wide.eval.cli`) loads a dense, training-free routed or trained model
(:func:`wide.io.load_model`), runs :func:`evaluate` and writes ``results.json`` + ``results.md``. Realized
sparsity is measured next to every score (:class:`SparsityMeter`).

The names below are imported on first use, so that ``wide eval --help`` and its argument errors need no torch.
"""

from __future__ import annotations

import importlib
from typing import Any

DEFAULT_WINDOW = 1024
"""Tokens per perplexity window (here rather than in `wide.eval.perplexity` so the CLI reads it without torch)."""

_EXPORTS = {
    "Request": "loglik", "loglikelihoods": "loglik",
    "SparsityMeter": "meter", "merge_sparsity": "meter",
    "perplexity": "perplexity",
    "EvalSettings": "runner", "evaluate": "runner", "write_result": "runner",
    "DEFAULT_TASKS": "tasks", "TASKS": "tasks", "Question": "tasks", "TaskSpec": "tasks", "load_questions": "tasks",
    "parse_tasks": "tasks",
    "evaluate_task": "zeroshot", "score_questions": "zeroshot",
}

__all__ = ["DEFAULT_WINDOW", *sorted(_EXPORTS)]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'wide.eval' has no attribute {name!r}")
    return getattr(importlib.import_module(f"wide.eval.{module}"), name)
