"""Collect a grid's cell results into ``results.csv``, ``results.md`` and plots."""

from __future__ import annotations

import csv
import io
import time
from pathlib import Path
from typing import Any, Optional

from wide.grid.files import read_json, write_text
from wide.grid.spec import GridSpec


def load_rows(spec: GridSpec) -> list[dict[str, Any]]:
    """One dict per cell in grid order: its ``result.json`` when finished, else its status."""
    rows = []
    for cell in spec.cells():
        cell_dir = Path(spec.output) / "cells" / cell.name
        row = read_json(cell_dir / "result.json")
        if row is None:
            error = cell_dir / "error.txt"
            row = {"cell": cell.name, "labels": cell.labels, "status": "failed" if error.is_file() else "pending"}
            if error.is_file():
                row["error"] = error.read_text().strip()
        rows.append(row)
    return rows


def _task_names(rows: list[dict[str, Any]]) -> list[str]:
    from wide.eval.tasks import TASKS

    seen = {t for r in rows for t in r.get("tasks", {})}
    return [t for t in TASKS if t in seen] + sorted(seen - set(TASKS))


GENERATIVE_COLUMNS = {"arithmetic_em": "arith EM", "token_agreement": "agreement"}
"""``wide eval --generative`` summary fields a grid reports (CSV name: Markdown header), when any cell measured them."""


def _gen_columns(rows: list[dict[str, Any]]) -> list[str]:
    seen = {k for r in rows for k, v in ((r.get("summary") or {}).get("generative") or {}).items() if v is not None}
    return [k for k in GENERATIVE_COLUMNS if k in seen]


RETAINED = ("avg", "arithmetic_em")
"""Summary scores a grid also reports as a share of the same model's dense cell (``<name>_of_dense``): the average
zero-shot score, and arithmetic exact match (generation retention; token agreement is against dense already)."""


def _retained_scores(summary: dict[str, Any]) -> dict[str, Optional[float]]:
    """A cell summary's `RETAINED` scores (None where it did not measure one)."""
    return {"avg": summary.get("avg"), "arithmetic_em": (summary.get("generative") or {}).get("arithmetic_em")}


def dense_reference(rows: list[dict[str, Any]]) -> dict[Any, dict[str, float]]:
    """Per model, the first finished dense cell's (routing off) `RETAINED` scores that it measured (a zero is left
    out: no share of it)."""
    refs: dict[Any, dict[str, float]] = {}
    for r in rows:
        s = r.get("summary")
        if r.get("status") != "done" or not s or s.get("method") != "dense" or r.get("model") in refs:
            continue
        refs[r.get("model")] = {k: v for k, v in _retained_scores(s).items() if v}
    return refs


def retained(row: dict[str, Any], refs: dict[Any, dict[str, float]]) -> dict[str, Optional[float]]:
    """The row's `RETAINED` scores over its model's dense ones (None where either is missing)."""
    ref = refs.get(row.get("model"), {})
    mine = _retained_scores(row.get("summary") or {})
    return {k: (mine[k] / ref[k] if mine[k] is not None and k in ref else None) for k in RETAINED}


def flat_rows(spec: GridSpec, rows: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """CSV columns and values (numbers unformatted; scores and sparsities as fractions)."""
    axes = [a.name for a in spec.axes]
    tasks = _task_names(rows)
    gens = _gen_columns(rows)
    cols = ["cell", *axes, "status", "model", "routing", "trained", "target_sparsity", "realized_sparsity",
            "realized_by_weight", "realized_attn", "realized_ffn", "ppl", "ppl_sparsity", *tasks, "avg", "zeroshot_sparsity",
            *gens, *(f"{k}_of_dense" for k in RETAINED),
            "calibrate_steps", "calibrate_tokens", "calibrate_wall_s", "lora_steps", "lora_tokens", "lora_wall_s",
            "eval_wall_s"]
    refs = dense_reference(rows)
    out = []
    for r in rows:
        flat: dict[str, Any] = {"cell": r["cell"], "status": r["status"], **r.get("labels", {})}
        s = r.get("summary")
        if s:
            sp = s["sparsity"]
            flat.update({"model": r.get("model"), "routing": s["method"], "trained": trained(r),
                         "target_sparsity": s["target_sparsity"], "ppl": s.get("ppl"),
                         "ppl_sparsity": s.get("ppl_sparsity"), "avg": s.get("avg"),
                         "zeroshot_sparsity": s.get("zeroshot_sparsity"), "realized_sparsity": sp["sparsity"],
                         "realized_by_weight": sp.get("by_weight"),
                         "realized_attn": sp.get("by_kind", {}).get("attn"),
                         "realized_ffn": sp.get("by_kind", {}).get("ffn"),
                         "eval_wall_s": r.get("eval", {}).get("wall_s")})
            for t in tasks:
                flat[t] = r.get("tasks", {}).get(t, {}).get("score")
            for g in gens:
                flat[g] = (s.get("generative") or {}).get(g)
            flat.update({f"{k}_of_dense": v for k, v in retained(r, refs).items()})
            for stage, run in (r.get("runs") or {}).items():
                flat[f"{stage}_steps"] = run.get("steps")
                flat[f"{stage}_tokens"] = run.get("tokens")
                flat[f"{stage}_wall_s"] = run.get("wall_s")
        out.append(flat)
    return cols, out


def trained(row: dict[str, Any]) -> str:
    """``none`` (dense or training-free), ``calibrate`` or ``calibrate+lora``."""
    return "+".join(row.get("runs") or {}) or "none"


def to_csv(cols: list[str], flat: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in flat:
        writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in cols})
    return buf.getvalue()


def _pct(v: Optional[float]) -> str:
    return "–" if v is None else f"{100 * v:.1f}"


def _share(v: Optional[float]) -> str:
    """`` (N%)`` after a score: its share of dense; empty where there is none."""
    return "" if v is None else f" ({100 * v:.0f}%)"


def _num(v: Optional[float], fmt: str = "{:,}") -> str:
    return "–" if v is None else fmt.format(v)


def _secs(v: Optional[float]) -> str:
    if v is None:
        return "–"
    return f"{v:.0f} s" if v < 120 else f"{v / 60:.1f} min"


def to_markdown(spec: GridSpec, rows: list[dict[str, Any]]) -> str:
    """Scores table (realized sparsity next to the target) and a runs table (steps, tokens, wall time)."""
    axes = [a.name for a in spec.axes]
    tasks = _task_names(rows)
    gens = _gen_columns(rows)
    refs = dense_reference(rows)
    of_dense = any("avg" in ref for ref in refs.values())  # the "% of dense" column
    short = {"arc_easy": "ARC-e", "arc_challenge": "ARC-c", "boolq": "BoolQ", "winogrande": "Wino",
             "piqa": "PIQA", "openbookqa": "OBQA", "hellaswag": "HSwag"}
    hw = next((r.get("hardware") for r in rows if r.get("hardware")), None) or {}
    settings = next((read_json(Path(r["eval"]["results"])) or {} for r in rows if r.get("eval")), {}).get("settings", {})
    lines = [f"## wide grid: {spec.path.name}", ""]
    lines.append(f"Base recipe `{spec.base.name}`" + (f", stage 2 `{spec.lora_base.name}`" if spec.lora_base else "")
                 + f"; output `{spec.output}`; {sum(r['status'] == 'done' for r in rows)}/{len(rows)} cells done"
                 + f" (updated {time.strftime('%Y-%m-%d %H:%M')}).")
    if hw:
        lines.append(f"Eval hardware: {hw.get('gpu') or hw.get('cpu') or hw.get('device')} "
                     f"({hw.get('device')}, torch {hw.get('torch')}).")
    if settings:
        ppl = settings.get("ppl_source")
        lim = settings.get("limit")
        lines.append(f"Eval: perplexity on `{ppl}` (window {settings.get('ppl_window')}, stride "
                     f"{settings.get('ppl_stride') or settings.get('ppl_window')}"
                     + (f", first {settings['ppl_max_tokens']:,} tokens" if settings.get("ppl_max_tokens") else "")
                     + ")" + (f"; zero-shot {'first ' + str(lim) + ' items per task' if lim else 'all items'}"
                              if settings.get("tasks") else "; no zero-shot tasks") + ".")
    lines += ["", "| " + " | ".join([*axes, "routing", "trained", "target", "realized", "by weight", "ppl",
                                      *[short.get(t, t) for t in tasks], "avg", *(["% of dense"] if of_dense else []),
                                      *[GENERATIVE_COLUMNS[g] for g in gens]]) + " |",
              "|" + "---|" * (len(axes) + 2) + "---:|" * (5 + len(tasks) + of_dense + len(gens))]
    for r in rows:
        labels = [str(r.get("labels", {}).get(a, "")) for a in axes]
        s = r.get("summary")
        if not s:
            lines.append("| " + " | ".join([*labels, f"*{r['status']}*",
                                            *[""] * (6 + len(tasks) + of_dense + len(gens))]) + " |")
            continue
        ts = r.get("tasks", {})
        kept = retained(r, refs)
        lines.append("| " + " | ".join([
            *labels, s["method"], trained(r), _pct(s["target_sparsity"]), _pct(s["sparsity"]["sparsity"]),
            _pct(s["sparsity"].get("by_weight")),
            "–" if s.get("ppl") is None else f"{s['ppl']:.2f}",
            *[_pct(ts[t]["score"]) if t in ts else "–" for t in tasks], _pct(s.get("avg")),
            *([_pct(kept["avg"])] if of_dense else []),
            *[_pct((s.get("generative") or {}).get(g)) + _share(kept.get(g)) for g in gens],
        ]) + " |")
    lines += ["", "target/realized: target and realized sparsity (%; realized over all eval forwards, token-weighted; "
              "the target is by weight under `sparsity_measure: weight`); realized is the router kinds' skip rates "
              "averaged, by weight the share of the routed weights' work skipped (what speed follows). "
              "Scores: acc_norm for ARC, PIQA, OBQA, HellaSwag, acc for BoolQ and WinoGrande (%); avg over the tasks "
              "shown." + (" % of dense: avg over the same model's dense cell's." if of_dense else "")
              + (" arith EM: 5-shot basic-arithmetic exact match (in brackets: of the dense cell's, where it measured "
                 "it); agreement: share of the dense model's first greedy answer tokens the model predicts "
                 "(`wide eval --generative`)." if gens else ""),
              ""]
    run_rows = [r for r in rows if r.get("runs")]
    if run_rows:
        lines += ["### Runs", "", "| cell | stage | steps | tokens | wall time | batch × seq_len |", "|---|---|---:|---:|---:|---|"]
        first: dict[str, str] = {}
        for r in run_rows:
            for stage, run in r["runs"].items():
                shared = first.setdefault(str(run.get("dir")), r["cell"])
                if shared != r["cell"]:
                    lines.append(f"| {r['cell']} | {stage} | same run as {shared} | | | |")
                    continue
                lines.append(f"| {r['cell']} | {stage} | {_num(run.get('steps'))} | {_num(run.get('tokens'))} | "
                             f"{_secs(run.get('wall_s'))} | {run.get('batch_size')} × {run.get('seq_len')} |")
        lines.append("")
    evals = [r for r in rows if r.get("eval")]
    if evals:
        lines.append("Eval wall time per cell: " + ", ".join(
            f"{r['cell']} {_secs(r['eval'].get('wall_s'))}" for r in evals) + ".")
    failures = [r for r in rows if r.get("error")]
    if failures:  # the reason next to the table: a grid run remotely may not bring its cell folders back
        lines += ["", "### Failed cells", ""]
        for r in failures:
            lines += [f"{r['cell']} (`cells/{r['cell']}/error.txt`):", "", "```", r["error"][-3000:], "```", ""]
    return "\n".join(lines) + "\n"


def collect(spec: GridSpec, plots: bool = True) -> list[Path]:
    """Writes ``results.csv`` and ``results.md`` (and, with ``plots``, the PNGs); returns the paths."""
    out = Path(spec.output)
    rows = load_rows(spec)
    cols, flat = flat_rows(spec, rows)
    paths = [write_text(out / "results.csv", to_csv(cols, flat)), write_text(out / "results.md", to_markdown(spec, rows))]
    if plots:
        from wide.grid.plots import plot_all

        paths += plot_all(spec, rows)
    return paths
