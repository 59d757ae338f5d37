"""Issue 22's quality-speed frontier: a `wide grid` run's quality joined with `wide bench`'s 8B-shape speed.

Reads the grid's output folder (``cells/*/result.json``, what `wide.grid.runner` writes per finished cell; without a
``cells/`` folder, its ``results.csv``) and one ``wide bench --json`` file, and writes a Markdown table (method,
target, realized sparsity by weight and kinds-averaged, perplexity, average zero-shot, % of dense's average, decode
and prefill speed-up) and a PNG (average zero-shot against decode and prefill speed-up, one line per method).

Speed is looked up by the cell's *realized* by-weight sparsity (the share of the routed weights' work its eval
skipped), linearly interpolated between the bench rows' realized by-weight rates; a cell up to ``--extrapolate``
outside them takes the end segment extended (marked †), farther gets none. Dense is 1.00x by definition. The bench
times WIDE's routed kernels on random per-token masks: depth, sublayer and static cells are placed at the same rate as
a by-weight proxy, not timed as what they are (whole-layer skips, physically pruned static width).

    python -m wide.cli bench --fuse-glue --router random --sparsity 0 0.25 0.4 0.5 0.6 --prefill 4096 \\
        --decode-batch 1 --json bench.json                              # on the GPU, 8B shape (random weights)
    python benchmarks/frontier.py runs/grid/frontier_smollm2-135m --bench bench.json
        # -> runs/grid/frontier_smollm2-135m/frontier.md, plots/frontier.png
"""

from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import common  # noqa: E402


# --------------------------------------------------------------------------------------------------
# the grid's cells
# --------------------------------------------------------------------------------------------------


def _num(value) -> Optional[float]:
    if value is None or value == "":
        return None
    value = float(value)
    return None if math.isnan(value) else value


def grid_rows(folder: Path, method_axis: str = "method") -> list[dict]:
    """One dict per finished cell (``method``, ``target``, ``measure``, ``by_weight``, ``kinds``, ``ppl``, ``avg``,
    ``dense``): dense first (once: the grid's dense cells evaluate one model), then the methods in grid order, each
    by target."""
    order = (json.loads((folder / "grid.json").read_text()).get("cells", []) if (folder / "grid.json").is_file()
             else [])
    cells = folder / "cells"
    raw = []
    if cells.is_dir():
        found = {p.parent.name: p for p in cells.glob("*/result.json")}
        for name in [c for c in order if c in found] + sorted(set(found) - set(order)):
            r = json.loads(found[name].read_text())
            if r.get("status") != "done":
                continue
            s, routing = r["summary"], r.get("routing")
            raw.append(dict(cell=name, method=r.get("labels", {}).get(method_axis) or s["method"],
                            dense=routing is None, target=s["target_sparsity"],
                            measure=(routing or {}).get("sparsity_measure", "kinds"),
                            by_weight=_num(s["sparsity"].get("by_weight")), kinds=_num(s["sparsity"]["sparsity"]),
                            ppl=_num(s.get("ppl")), avg=_num(s.get("avg"))))
    elif (folder / "results.csv").is_file():
        with open(folder / "results.csv", newline="") as f:
            for r in csv.DictReader(f):
                if r.get("status") != "done":
                    continue
                dense = r.get("routing") == "dense"
                raw.append(dict(cell=r["cell"], method=r.get(method_axis) or r.get("routing"), dense=dense,
                                target=_num(r.get("target_sparsity")) or 0.0, measure="?",
                                by_weight=_num(r.get("realized_by_weight")), kinds=_num(r.get("realized_sparsity")),
                                ppl=_num(r.get("ppl")), avg=_num(r.get("avg"))))
    else:
        raise SystemExit(f"frontier.py: {folder} holds neither cells/*/result.json nor results.csv (a `wide grid` "
                         "output folder?)")
    if not raw:
        raise SystemExit(f"frontier.py: no finished cell in {folder}")
    dense = [r for r in raw if r["dense"]][:1]
    for r in dense:
        r["by_weight"], r["kinds"] = 0.0, 0.0
    methods = list(dict.fromkeys(r["method"] for r in raw if not r["dense"]))
    routed = sorted((r for r in raw if not r["dense"]), key=lambda r: (methods.index(r["method"]), r["target"]))
    return dense + routed


# --------------------------------------------------------------------------------------------------
# the bench's speed curves
# --------------------------------------------------------------------------------------------------


def bench_curves(payload: dict, decode_batch: int, prefill: int, prefill_mode: Optional[str]) -> dict:
    """``{"decode": [(by weight, speed-up)], "prefill": [...], "prefill_mode": str}`` from ``wide bench --json``'s
    latency rows: per-token decode steps of ``decode_batch`` rows, prefills of ``prefill`` tokens (``prefill_mode``:
    ``graph``, ``eager`` or a chunked row's mode; default graph where timed, else eager)."""
    rows = payload.get("rows") or []
    decode = [r for r in rows if r["phase"] == "decode" and r["batch"] == decode_batch
              and r.get("routing", "per-token") == "per-token"]
    if not decode:
        raise SystemExit(f"frontier.py: --decode-batch {decode_batch}: the bench file has no per-token decode rows "
                         f"of that batch (batches: {sorted({r['batch'] for r in rows if r['phase'] == 'decode'})})")
    pre = [r for r in rows if r["phase"] == "prefill" and r["tokens"] == prefill]
    if not pre:
        raise SystemExit(f"frontier.py: --prefill {prefill}: the bench file has no prefill rows of that length "
                         f"(lengths: {sorted({r['tokens'] for r in rows if r['phase'] == 'prefill'})})")
    modes = list(dict.fromkeys(r["mode"] for r in pre))
    mode = prefill_mode or ("graph" if "graph" in modes else "eager" if "eager" in modes else modes[0])
    if mode not in modes:
        raise SystemExit(f"frontier.py: --prefill-mode {mode!r}: the bench's {prefill}-token prefills ran as {modes}")
    return {"decode": _curve(decode), "prefill": _curve([r for r in pre if r["mode"] == mode]), "prefill_mode": mode}


def _curve(rows: list[dict]) -> list[tuple[float, float]]:
    """(realized by-weight rate, dense ms / routed ms) points sorted by rate; rows at one rate averaged. A row without
    a realized rate (NaN) sits at its target."""
    points: dict[float, list[float]] = {}
    for r in rows:
        x = _num(r.get("realized_by_weight"))
        points.setdefault(round(r["sparsity"] if x is None else x, 6), []).append(r["ratio"])
    return sorted((x, sum(ys) / len(ys)) for x, ys in points.items())


def lookup(curve: list[tuple[float, float]], x: Optional[float], margin: float) -> tuple[Optional[float], bool]:
    """``(speed-up at rate x, extrapolated?)``: linear between the curve's points, the end segment extended up to
    ``margin`` beyond them; ``(None, False)`` farther, or without a rate."""
    if x is None or not curve:
        return None, False
    xs = [p[0] for p in curve]
    if len(curve) == 1:
        return (curve[0][1], False) if abs(x - xs[0]) <= 1e-9 else (None, False)
    if x < xs[0] - margin or x > xs[-1] + margin:
        return None, False
    if x <= xs[0]:
        i = 1
    elif x >= xs[-1]:
        i = len(xs) - 1
    else:
        i = next(k for k in range(1, len(xs)) if x <= xs[k])
    (x0, y0), (x1, y1) = curve[i - 1], curve[i]
    y = y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return y, not xs[0] <= x <= xs[-1]


# --------------------------------------------------------------------------------------------------
# table and plot
# --------------------------------------------------------------------------------------------------


def join(rows: list[dict], curves: dict, margin: float) -> list[dict]:
    """The grid's rows with ``decode`` / ``prefill`` speed-ups (and ``*_extrapolated``) and ``of_dense``."""
    dense_avg = next((r["avg"] for r in rows if r["dense"]), None)
    out = []
    for r in rows:
        r = dict(r)
        for phase in ("decode", "prefill"):
            r[phase], r[f"{phase}_extrapolated"] = (1.0, False) if r["dense"] else lookup(curves[phase], r["by_weight"],
                                                                                         margin)
        r["of_dense"] = r["avg"] / dense_avg if r["avg"] is not None and dense_avg else None
        out.append(r)
    return out


def _pct(v: Optional[float]) -> str:
    return "–" if v is None else f"{100 * v:.1f}"


def _speed(v: Optional[float], extrapolated: bool) -> str:
    return "–" if v is None else f"{v:.2f}x" + ("†" if extrapolated else "")


def markdown(rows: list[dict], curves: dict, bench: dict, args, grid: Path) -> str:
    b = bench.get("args", {})
    ctx, d_rates = b.get("context", "?"), [x for x, _ in curves["decode"]]
    length = f"{args.prefill // 1024}k" if args.prefill % 1024 == 0 else str(args.prefill)
    lines = [f"Quality: `{grid}`; speed: `{', '.join(args.bench)}` ({bench.get('device', '?')}, torch {bench.get('torch', '?')}).",
             "",
             f"| method | target | realized by weight | realized (kinds) | ppl | avg zero-shot | % of dense avg | "
             f"8B decode b{args.decode_batch} speed-up | 8B {length} prefill speed-up |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        target = "–" if r["dense"] else _pct(r["target"]) + ("" if r["measure"] == "weight" else f" ({r['measure']})")
        ppl = "–" if r["ppl"] is None else f"{r['ppl']:.2f}"
        lines.append(f"| {r['method']} | {target} | {_pct(r['by_weight'])} | {_pct(r['kinds'])} | {ppl} | "
                     f"{_pct(r['avg'])} | {_pct(r['of_dense'])} | {_speed(r['decode'], r['decode_extrapolated'])} | "
                     f"{_speed(r['prefill'], r['prefill_extrapolated'])} |")
    lines += ["",
              "Sparsities in %. Target: the share of the routed weights to skip (`sparsity_measure: weight`; another "
              "measure is named, ? where results.csv does not say). Realized: over every eval forward, "
              "token-weighted; by weight is the share of the routed weights' work skipped (q+o, gate+up+down; K/V "
              "always run), kinds the attention and FFN skip rates averaged. Avg zero-shot over the tasks the grid "
              "ran; % of dense: its ratio to dense's average.",
              f"Speed-ups: dense ms / routed ms from `wide bench` on the Llama-3.1-8B shape with random weights "
              f"(router {b.get('router', '?')}, FFN groups of {b.get('ffn_group_size', '?')}, fuse-glue "
              f"{'on' if b.get('fuse_glue') else 'off'}): a batch-{args.decode_batch} per-token decode step at a "
              f"{ctx}-token context and a {args.prefill}-token prefill ({curves['prefill_mode']}). Each cell is "
              f"looked up at its **realized by-weight** rate, linearly interpolated between the bench rows' realized "
              f"by-weight rates ({min(d_rates):.3f}–{max(d_rates):.3f} for decode); † marks a rate up to "
              f"{args.extrapolate:g} outside them (the end segment extended), – farther. Dense is 1.00x by "
              "definition. "
              "The bench times WIDE's routed kernels on per-token masks: depth, sublayer and static cells sit at the "
              "speed of WIDE at their by-weight rate, a proxy (whole-layer skips and physically pruned static width "
              "would be timed differently)."]
    return "\n".join(lines)


def plot(rows: list[dict], path: Path, title: str, decode_batch: int, prefill: int) -> Optional[Path]:
    """Average zero-shot against decode (left) and prefill (right) speed-up, one line per method, dense as a star."""
    if not any(r["avg"] is not None for r in rows):
        return None
    from wide.grid.plots import pyplot, save_figure

    fig, axes = pyplot().subplots(1, 2, figsize=(12, 4.6), squeeze=False)
    methods = list(dict.fromkeys(r["method"] for r in rows if not r["dense"]))
    dense = next((r for r in rows if r["dense"] and r["avg"] is not None), None)
    for ax, phase, label in ((axes[0][0], "decode", f"8B decode batch {decode_batch} speed-up (x)"),
                             (axes[0][1], "prefill", f"8B {prefill}-token prefill speed-up (x)")):
        for i, m in enumerate(methods):
            pts = sorted((r[phase], 100 * r["avg"], r["target"]) for r in rows
                         if r["method"] == m and not r["dense"] and r[phase] is not None and r["avg"] is not None)
            if not pts:
                continue
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=f"C{i % 10}", label=m)
            for x, y, t in pts:
                ax.annotate(f"{100 * t:.0f}", (x, y), textcoords="offset points", xytext=(3, 3), fontsize=7)
        if dense is not None:
            ax.axhline(100 * dense["avg"], color="black", linestyle="--", linewidth=1)
            ax.plot([1.0], [100 * dense["avg"]], marker="*", markersize=12, color="black", linestyle="", label="dense")
        ax.set_xlabel(label)
        ax.set_ylabel("average zero-shot (%)")
        ax.grid(True, alpha=0.3)
    axes[0][1].legend(fontsize=8, loc="best")
    fig.suptitle(f"{title}: quality vs speed at the realized by-weight sparsity (point labels: target %)")
    return save_figure(fig, path, dpi=110)


def main(argv: Optional[list[str]] = None) -> None:
    ap = common.parser(__doc__, device=None, dtype=None)
    ap.add_argument("grid", help="a `wide grid` output folder (cells/*/result.json or results.csv)")
    ap.add_argument("--bench", required=True, nargs="+",
                    help="`wide bench --json` files with the speed rows (several: their rows pooled, one shape)")
    ap.add_argument("--decode-batch", type=int, default=1, help="the decode rows' batch (default: %(default)s)")
    ap.add_argument("--prefill", type=int, default=4096, help="the prefill rows' length (default: %(default)s)")
    ap.add_argument("--prefill-mode", default=None,
                    help="the prefill rows' mode: graph, eager or a chunked mode (default: graph where timed)")
    ap.add_argument("--method-axis", default="method", help="the grid axis naming the method (default: %(default)s)")
    ap.add_argument("--extrapolate", type=float, default=0.05,
                    help="how far past the bench's rates a cell's rate may extend the end segment "
                         "(default: %(default)s)")
    ap.add_argument("--plot", default=None, help="the PNG (default: GRID/plots/frontier.png)")
    args = ap.parse_args(argv)
    grid = Path(args.grid)
    if not grid.is_dir():
        raise SystemExit(f"frontier.py: {grid} is not a folder")
    for f in args.bench:
        if not Path(f).is_file():
            raise SystemExit(f"frontier.py: --bench {f} does not exist")
    if args.extrapolate < 0:
        raise SystemExit(f"frontier.py: --extrapolate must be >= 0, got {args.extrapolate}")
    payloads = [json.loads(Path(f).read_text()) for f in args.bench]
    bench = dict(payloads[0], rows=[r for b in payloads for r in b.get("rows") or []])
    curves = bench_curves(bench, args.decode_batch, args.prefill, args.prefill_mode)
    rows = join(grid_rows(grid, args.method_axis), curves, args.extrapolate)
    args.md = args.md or str(grid / "frontier.md")
    png = plot(rows, Path(args.plot or grid / "plots" / "frontier.png"), grid.name, args.decode_batch, args.prefill)
    text = markdown(rows, curves, bench, args, grid)
    if png is not None:
        text += f"\n\nPlot: `{png}`."
    common.report(args, {"args": vars(args), "curves": curves, "rows": rows}, text, "cpu")


if __name__ == "__main__":
    main()
