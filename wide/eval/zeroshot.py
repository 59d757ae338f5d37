"""Zero-shot accuracy: lm-eval's ``acc`` and ``acc_norm`` over the local task data."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Optional

from torch import nn

from wide.eval.loglik import Request, loglikelihoods
from wide.eval.meter import SparsityMeter
from wide.eval.tasks import TASKS, Question, load_questions


def score_questions(questions: list[Question], results: list[tuple[float, bool]]) -> dict[str, float]:
    """lm-eval's multiple-choice metrics.

    ``acc``: the choice with the highest summed log-likelihood is the gold one. ``acc_norm``: the same
    after dividing each log-likelihood by the character length of its choice text. Ties go to the
    first choice (``numpy.argmax``). Returns means over questions.
    """
    acc = acc_norm = 0.0
    pos = 0
    for q in questions:
        lls = [ll for ll, _ in results[pos:pos + len(q.continuations)]]
        pos += len(q.continuations)
        acc += float(_argmax(lls) == q.gold)
        normed = [ll / max(1, len(t)) for ll, t in zip(lls, q.norm_texts)]
        acc_norm += float(_argmax(normed) == q.gold)
    n = max(1, len(questions))
    return {"acc": acc / n, "acc_norm": acc_norm / n}


def _argmax(values: list[float]) -> int:
    best = 0
    for i, v in enumerate(values):
        if v > values[best]:
            best = i
    return best


def evaluate_task(
    model: nn.Module,
    tokenizer,
    task: str,
    *,
    limit: Optional[int] = None,
    batch_size: int = 8,
    add_bos: str = "auto",
    data_dir: Optional[str | Path] = None,
    progress: Optional[Callable[[int, int], None]] = None,
) -> dict[str, Any]:
    """Scores one task; returns its metrics (only those lm-eval reports for it), item count and sparsity."""
    spec = TASKS[task]
    questions = load_questions(task, limit, data_dir)
    requests = [Request(c, k) for q in questions for c, k in zip(q.contexts, q.continuations)]
    meter = SparsityMeter(model)
    results = loglikelihoods(model, tokenizer, requests, batch_size=batch_size, add_bos=add_bos, meter=meter,
                             progress=progress)
    metrics = score_questions(questions, results)
    out: dict[str, Any] = {m: metrics[m] for m in spec.metrics}
    n = len(questions)
    for m in spec.metrics:  # binomial standard error, as lm-eval's ``mean`` stderr
        p = out[m]
        out[f"{m}_stderr"] = math.sqrt(p * (1 - p) / (n - 1)) if n > 1 else float("nan")
    out.update({
        "metric": spec.headline,
        "score": out[spec.headline],
        "n": n,
        "requests": len(requests),
        "split": spec.split,
        "lm_eval_split": spec.lm_eval_split,
        "sparsity": meter.result(),
    })
    return out
