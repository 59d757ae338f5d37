"""``benchmarks/batched_topk.py`` runs on a tiny model: batched top-k reads exactly its rate at every batch size."""

import importlib.util
import json
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "batched_topk_bench", Path(__file__).resolve().parents[1] / "benchmarks" / "batched_topk.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_tiny_run_keeps_batched_topk_at_its_rate(tmp_path):
    out = tmp_path / "rows.json"
    bench.main(["--tiny", "--device", "cpu", "--dtype", "fp32", "--seqs", "4", "--calib-seqs", "2", "--prefix", "8",
                "--steps", "3", "--batches", "1", "4", "--quality-batches", "4", "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 2 * 7
    for row in rows:
        if row["routing"].startswith("batched top-k"):
            assert row["read_skip"] == row["target"] == 0.5 and row["row_skip"] == 0.5
        if row["routing"] == "dense":
            assert row["read_skip"] == 0.0 and (row["batch"] == 1 or row["agreement"] == 1.0)
        if row["routing"].startswith("per-token") and row["batch"] == 4:
            assert row["read_skip"] < 0.5 and row["row_skip"] == 0.5  # each row skips half; the step reads more
