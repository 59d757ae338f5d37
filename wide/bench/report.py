"""The bench's tables, the lines printed under them, and its JSON files."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

KERNEL_SWITCHES = ("WIDE_KERNEL_BACKEND",)


def kernel_switches() -> dict:
    """The environment variables that change which kernels routed ops take, where set: a table timed under one
    of them says so (report line and JSON ``env``; the kernel options it ran with go to ``kernel_options``)."""
    return {k: os.environ[k] for k in KERNEL_SWITCHES if k in os.environ}


def coherent_name(scale: float) -> str:
    """The ``routing`` column of a batch-coherent row keeping ``scale`` times the rows' mean group count."""
    return "coherent" if scale == 1.0 else f"coherent x{scale:g}"


def format_table(rows: list[dict]) -> str:
    """The latency rows as a Markdown table; decode rows add each side's bandwidth floor (dense / routed) and the
    measured time as a share of it ("n/a" without a measured bandwidth, "-" on prefill rows)."""
    head = ("| phase | batch | tokens | sparsity | realized | by weight | routing | dense ms | routed ms | dense/routed "
            "| floor ms d / r | % of floor d / r | mode |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        realized = r.get("realized", float("nan"))
        by_weight = r.get("realized_by_weight", float("nan"))
        lines.append(f"| {r['phase']} | {r['batch']} | {r['tokens']} | {r['sparsity']:.2f} | {realized:.3f} | "
                     f"{by_weight:.3f} | "
                     f"{r['routing']} | {r['dense_ms']:.2f} | {r['routed_ms']:.2f} | {r['ratio']:.2f}x | "
                     f"{_floor_cells(r)} | {r['mode']} |")
    return "\n".join(lines)


def _floor_cells(r: dict) -> str:
    if "dense_floor_ms" not in r:
        return "- | -"
    if r["dense_floor_ms"] is None or r.get("routed_floor_ms") is None:
        return "n/a | n/a"
    return (f"{r['dense_floor_ms']:.2f} / {r['routed_floor_ms']:.2f} | "
            f"{r['dense_of_floor']:.0%} / {r['routed_of_floor']:.0%}")


def _size(nbytes: int) -> str:
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e8 else f"{nbytes / 1e6:.3f} MB"


def latency_notes(args, rows: list[dict], switches: dict, bandwidth: Optional[dict] = None) -> list[str]:
    """The lines printed under the latency table: the bandwidth the floors divide by, every dense decode variant's
    time (and its bytes a step), and what both sides ran under."""
    lines = []
    if any(r["phase"] == "decode" for r in rows):
        if bandwidth:
            lines.append(f"device bandwidth {bandwidth['bandwidth'] / 1e12:.2f} TB/s (best of {bandwidth['iters']} "
                         f"over {bandwidth['gib']:g} GiB: copy {bandwidth['copy'] / 1e12:.2f}, read-only sum "
                         f"{bandwidth['read'] / 1e12:.2f}); floor = bytes a decode step reads / bandwidth, "
                         "% of floor = measured / floor")
        else:
            lines.append("no floors: the device bandwidth is measured on CUDA only (the bytes each decode step reads "
                         "are in the JSON's dense_bytes / routed_bytes)")
    seen = set()
    for r in rows:
        if r["phase"] == "decode" and r["batch"] not in seen:
            seen.add(r["batch"])
            variants = ", ".join(f"{k} {v:.2f} ms" if v != float("inf") else f"{k} skipped"
                                 for k, v in r["dense_variants"].items())
            read = f" (reads {_size(r['dense_bytes']['total'])} a step)" if "dense_bytes" in r else ""
            lines.append(f"dense decode batch {r['batch']}{read}: {variants} (fastest is the baseline)")
    if getattr(args, "ids", None) == "text":
        lines.append(f"token ids: text ({args.text_source!r} in the model's tokenizer)")
    elif getattr(args, "ids", None) == "random":
        lines.append("token ids: random (below 1000)")
    if args.compile:
        lines.append(f"both sides' forwards under torch.compile(backend={args.compile!r}); routed ops run as eager "
                     "graph breaks")
    if args.fuse_glue:
        lines.append(f"both sides' RMS norms, RoPE and dense MLP act*up compiled (wide.fuse_glue, {args.fuse_glue})")
    if getattr(args, "weight_layout", "row") != "row":
        lines.append(f"routed model's o_proj / down_proj weights stored {args.weight_layout}-major "
                     "(wide.set_weight_layout)")
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
