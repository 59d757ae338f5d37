"""Grid plots: score vs realized sparsity per method, and per-layer realized sparsity heatmaps."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from wide.grid.spec import GridSpec


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path, dpi: int = 100) -> Path:
    """Lays ``fig`` out, writes it to ``path`` (parents made) and closes it."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path


def sparsity_axis(spec: GridSpec) -> Optional[str]:
    """The axis that sets the target sparsity (by key, else by name), if any."""
    for axis in spec.axes:
        if axis.key is not None and axis.key.rsplit(".", 1)[-1] in ("sparsity", "attn_sparsity", "ffn_sparsity"):
            return axis.name
    for axis in spec.axes:
        if "sparsity" in axis.name:
            return axis.name
    return None


def _series(spec: GridSpec, rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    sp = sparsity_axis(spec)
    names = [a.name for a in spec.axes if a.name != sp] if sp else [a.name for a in spec.axes[:1]]
    out: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if not r.get("summary"):
            continue
        key = ", ".join(f"{r['labels'][n]}" if len(names) == 1 else f"{n}={r['labels'][n]}" for n in names) or "all"
        out.setdefault(key, []).append(r)
    return out


def plot_score_vs_sparsity(spec: GridSpec, rows: list[dict[str, Any]], path: Path) -> Optional[Path]:
    """Average zero-shot score and perplexity against realized sparsity, one line per series.

    A series is a combination of the non-sparsity axes (e.g. one method). Series that never skip
    anything (dense) are drawn as horizontal dashed reference lines.
    """
    series = _series(spec, rows)
    if not series:
        return None
    panels = []
    if any(r["summary"].get("avg") is not None for s in series.values() for r in s):
        panels.append(("avg", "zeroshot_sparsity", "average zero-shot score (%)", False))
    if any(r["summary"].get("ppl") is not None for s in series.values() for r in s):
        panels.append(("ppl", "ppl_sparsity", "perplexity (log scale)", True))
    if not panels:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 4.4), squeeze=False)
    for ax, (metric, xkey, ylabel, log) in zip(axes[0], panels):
        for i, (name, rs) in enumerate(sorted(series.items())):
            pts = sorted((100 * (r["summary"].get(xkey) or 0.0), r["summary"][metric]) for r in rs
                         if r["summary"].get(metric) is not None)
            if not pts:
                continue
            ys = [y * (100 if metric == "avg" else 1) for _, y in pts]
            color = f"C{i % 10}"
            if all(x == 0 for x, _ in pts):
                ax.axhline(sum(ys) / len(ys), color=color, linestyle="--", linewidth=1.2, label=name if "dense" in name else f"{name} (no skipping)")
                continue
            ax.plot([x for x, _ in pts], ys, marker="o", color=color, label=name)
        ax.set_xlabel("realized sparsity (%)")
        ax.set_ylabel(ylabel)
        if log:
            from matplotlib.ticker import LogLocator, ScalarFormatter

            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(ScalarFormatter())
            ax.yaxis.set_minor_formatter(ScalarFormatter())
            ax.yaxis.set_minor_locator(LogLocator(subs=(2, 3, 5)))
        ax.grid(True, alpha=0.3)
    axes[0][-1].legend(fontsize=8, loc="best")
    fig.suptitle(f"{spec.path.stem}: score vs realized sparsity")
    return save_figure(fig, path, dpi=110)


def _per_layer(row: dict[str, Any]) -> Optional[dict[str, Any]]:
    sp = (row.get("summary") or {}).get("sparsity") or {}
    return sp if sp.get("per_layer") else None


def plot_cell_heatmap(row: dict[str, Any], path: Path) -> Optional[Path]:
    """Realized skip rate per routed layer (columns) and router kind (rows) of one cell."""
    sp = _per_layer(row)
    if sp is None:
        return None
    plt = pyplot()
    kinds = list(sp["per_layer"])
    grid = [[100 * v for v in sp["per_layer"][k]] for k in kinds]
    layers = sp.get("layers") or list(range(len(grid[0])))
    fig, ax = plt.subplots(figsize=(min(18, max(6.0, 2.5 + 0.35 * len(layers))), 2.0 + 0.5 * len(kinds)))
    im = ax.imshow(grid, aspect="auto", cmap="magma", vmin=0, vmax=100)
    ax.set_yticks(range(len(kinds)), kinds)
    step = max(1, len(layers) // 16)
    ax.set_xticks(range(0, len(layers), step), [str(layers[i]) for i in range(0, len(layers), step)])
    ax.set_xlabel("decoder layer")
    target = row["summary"]["target_sparsity"]
    ax.set_title(f"{row['cell']}\nrealized sparsity per layer: target {100 * target:.0f}%, "
                 f"mean {100 * sp['sparsity']:.1f}%", fontsize=9)
    fig.colorbar(im, ax=ax, label="skipped (%)")
    return save_figure(fig, path)


def plot_grid_heatmap(rows: list[dict[str, Any]], path: Path) -> Optional[Path]:
    """All routed cells in one heatmap: cells (rows) × layers (columns), mean over router kinds."""
    rs = [r for r in rows if _per_layer(r)]
    if not rs:
        return None
    n = max(len(next(iter(_per_layer(r)["per_layer"].values()))) for r in rs)
    rs = [r for r in rs if len(next(iter(_per_layer(r)["per_layer"].values()))) == n]
    grid = []
    for r in rs:
        per = _per_layer(r)["per_layer"]
        grid.append([100 * sum(per[k][i] for k in per) / len(per) for i in range(n)])
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(min(18, max(7.0, 3 + 0.35 * n)), 1.6 + 0.35 * len(rs)))
    im = ax.imshow(grid, aspect="auto", cmap="magma", vmin=0, vmax=100)
    ax.set_yticks(range(len(rs)), [r["cell"] for r in rs], fontsize=7)
    ax.set_xlabel("routed layer")
    ax.set_title("realized sparsity per layer (mean over attention and FFN routers)", fontsize=9)
    fig.colorbar(im, ax=ax, label="skipped (%)")
    return save_figure(fig, path)


def plot_all(spec: GridSpec, rows: list[dict[str, Any]]) -> list[Path]:
    """``plots/score_vs_sparsity.png``, ``plots/sparsity_heatmap.png`` and ``plots/heatmaps/<cell>.png``.

    A cell's heatmap is redrawn only when its ``result.json`` is newer than the PNG.
    """
    out = Path(spec.output) / "plots"
    paths = [plot_score_vs_sparsity(spec, rows, out / "score_vs_sparsity.png"),
             plot_grid_heatmap(rows, out / "sparsity_heatmap.png")]
    for r in rows:
        if not _per_layer(r):
            continue
        png = out / "heatmaps" / f"{r['cell']}.png"
        result = Path(spec.output) / "cells" / r["cell"] / "result.json"
        if png.is_file() and result.is_file() and png.stat().st_mtime >= result.stat().st_mtime:
            paths.append(png)
            continue
        paths.append(plot_cell_heatmap(r, png))
    return [p for p in paths if p is not None]
