"""The bench's tables, the lines printed under them, and its JSON files."""

from __future__ import annotations

import json
import os
from pathlib import Path

KERNEL_SWITCHES = ("WIDE_KERNEL_BACKEND",)


def kernel_switches() -> dict:
    """The environment variables that change which kernels routed ops take, where set: a table timed under one
    of them says so (report line and JSON ``env``; the kernel options it ran with go to ``kernel_options``)."""
    return {k: os.environ[k] for k in KERNEL_SWITCHES if k in os.environ}


def coherent_name(scale: float) -> str:
    """The ``routing`` column of a batch-coherent row keeping ``scale`` times the rows' mean group count."""
    return "coherent" if scale == 1.0 else f"coherent x{scale:g}"


def format_table(rows: list[dict]) -> str:
    """The latency rows as a Markdown table."""
    head = ("| phase | batch | tokens | sparsity | realized | by weight | routing | dense ms | routed ms | dense/routed "
            "| mode |\n|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        realized = r.get("realized", float("nan"))
        by_weight = r.get("realized_by_weight", float("nan"))
        lines.append(f"| {r['phase']} | {r['batch']} | {r['tokens']} | {r['sparsity']:.2f} | {realized:.3f} | "
                     f"{by_weight:.3f} | "
                     f"{r['routing']} | {r['dense_ms']:.2f} | {r['routed_ms']:.2f} | {r['ratio']:.2f}x | {r['mode']} |")
    return "\n".join(lines)


def latency_notes(args, rows: list[dict], switches: dict) -> list[str]:
    """The lines printed under the latency table: every dense decode variant's time, and what both sides ran under."""
    lines = []
    seen = set()
    for r in rows:
        if r["phase"] == "decode" and r["batch"] not in seen:
            seen.add(r["batch"])
            lines.append(f"dense decode batch {r['batch']}: " + ", ".join(
                f"{k} {v:.2f} ms" for k, v in r["dense_variants"].items()) + " (fastest is the baseline)")
    if args.compile:
        lines.append(f"both sides' forwards under torch.compile(backend={args.compile!r}); routed ops run as eager "
                     "graph breaks")
    if args.fuse_glue:
        lines.append(f"both sides' RMS norms, RoPE and dense MLP act*up compiled (wide.fuse_glue, {args.fuse_glue})")
    if args.no_overlap_routing:
        lines.append("routed decode: the attention router on the main stream (--no-overlap-routing)")
    if switches:
        lines.append("kernel switches from the environment: " + ", ".join(f"{k}={v}" for k, v in switches.items()))
    return lines


def format_quality_table(rows: list[dict]) -> str:
    """The ``--quality`` rows as a Markdown table."""
    lines = ["| routing | batch | decode-token NLL | perplexity | groups a row runs | groups read (any row) | "
             "sequences x steps |\n|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['routing']} | {r['batch']} | {r['nll']:.4f} | {r['ppl']:.2f} | {r['row_runs']:.1%} | "
                     f"{r['weights_read']:.1%} | {r['seqs']} x {r['steps']} |")
    return "\n".join(lines)


def write_json(path: str, payload: dict) -> None:
    """``payload`` (the run's args and rows; the latency run adds device, torch and env) as indented JSON."""
    Path(path).write_text(json.dumps(payload, indent=2))
