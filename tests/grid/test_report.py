"""The grid report's shares of dense (`wide.grid.report`): fabricated cell results, no fits."""

import csv
from pathlib import Path
from types import SimpleNamespace

from wide.grid.report import dense_reference, flat_rows, retained, to_csv, to_markdown


def _row(cell, model, method, avg, arith=None, status="done"):
    summary = {"method": method, "target_sparsity": 0.0 if method == "dense" else 0.5, "ppl": 10.0,
               "ppl_sparsity": 0.0, "avg": avg, "zeroshot_sparsity": 0.0,
               "sparsity": {"sparsity": 0.0, "by_weight": 0.0, "by_kind": {}}}
    if arith is not None:
        summary["generative"] = {"arithmetic_em": arith, "token_agreement": None if method == "dense" else 0.7}
    return {"cell": cell, "labels": {"method": cell}, "status": status, "model": model, "summary": summary,
            "tasks": {"piqa": {"score": avg}}}


def _spec():
    return SimpleNamespace(axes=[SimpleNamespace(name="method")], path=Path("g.yaml"), base=Path("calibrate.yaml"),
                           lora_base=None, output="out")


def test_shares_of_dense_per_model_in_csv_and_markdown():
    rows = [_row("dense", "a", "dense", 0.60, arith=0.75),
            _row("wide", "a", "width/lowrank", 0.45, arith=0.78),
            _row("noarith", "a", "width/lowrank", 0.30),
            _row("otherdense", "b", "dense", 0.50),  # model b's dense measured no arithmetic
            _row("other", "b", "width/lowrank", 0.40, arith=0.10),
            _row("lost", "c", "width/lowrank", 0.40)]  # model c has no dense cell
    refs = dense_reference(rows)
    assert refs == {"a": {"avg": 0.60, "arithmetic_em": 0.75}, "b": {"avg": 0.50}}
    assert retained(rows[1], refs) == {"avg": 0.45 / 0.60, "arithmetic_em": 0.78 / 0.75}
    assert retained(rows[4], refs) == {"avg": 0.40 / 0.50, "arithmetic_em": None}
    assert retained(rows[5], refs) == {"avg": None, "arithmetic_em": None}

    cols, flat = flat_rows(_spec(), rows)
    table = list(csv.DictReader(to_csv(cols, flat).splitlines()))
    assert float(table[0]["avg_of_dense"]) == 1.0 and float(table[1]["arithmetic_em_of_dense"]) == 0.78 / 0.75
    assert table[2]["arithmetic_em_of_dense"] == "" and table[5]["avg_of_dense"] == ""

    md = to_markdown(_spec(), rows)
    assert "| avg | % of dense | arith EM | agreement |" in md
    assert "| 45.0 | 75.0 | 78.0 (104%) | 70.0 |" in md  # model a's WIDE row: both shares
    assert "| 40.0 | 80.0 | 10.0 | 70.0 |" in md  # model b: no arithmetic share without a dense one
    assert "| 40.0 | – | – | – |" in md  # model c: nothing to compare with
    assert "% of dense: avg over the same model's dense cell's." in md


def test_no_dense_cell_no_share_column():
    rows = [_row("wide", "a", "width/lowrank", 0.45), _row("dense", "a", "dense", 0.6, status="pending")]
    rows[1].pop("summary")
    md = to_markdown(_spec(), rows)
    assert "% of dense" not in md and "| dense | *pending* |" in md
    cols, flat = flat_rows(_spec(), rows)
    assert flat[0]["avg_of_dense"] is None and "avg_of_dense" in cols
