"""Quality evaluation: perplexity on held-out prose and lm-eval-style zero-shot accuracy.

``wide eval`` (see :mod:`wide.eval.cli`) loads a dense, training-free routed or trained model
(:func:`wide.io.load_model`), runs :func:`evaluate` and writes ``results.json`` + ``results.md``. Realized
sparsity is measured next to every score (:class:`SparsityMeter`).
"""

from wide.eval.loglik import Request, loglikelihoods
from wide.eval.meter import SparsityMeter, merge_sparsity
from wide.eval.perplexity import perplexity
from wide.eval.runner import EvalSettings, evaluate, write_result
from wide.eval.tasks import DEFAULT_TASKS, TASKS, Question, TaskSpec, load_questions, parse_tasks
from wide.eval.zeroshot import evaluate_task, score_questions

__all__ = [
    "DEFAULT_TASKS",
    "TASKS",
    "EvalSettings",
    "Question",
    "Request",
    "SparsityMeter",
    "TaskSpec",
    "evaluate",
    "evaluate_task",
    "load_questions",
    "loglikelihoods",
    "merge_sparsity",
    "parse_tasks",
    "perplexity",
    "score_questions",
    "write_result",
]
