"""Markdown rendering of one `wide eval` result."""

from __future__ import annotations

from typing import Any, Optional


def pct(value: Optional[float], digits: int = 1) -> str:
    return "–" if value is None else f"{100 * value:.{digits}f}"


def _generative_rows(gen: dict[str, Any]) -> list[str]:
    """The generative metrics' table, realized sparsity kinds-averaged and by routed weight."""
    if not gen:
        return []
    rows = ["| generation | n | score | realized sparsity | by weight |", "|---|---:|---:|---:|---:|"]

    def cells(r: dict[str, Any]) -> str:
        sp = r["sparsity"]
        return f"{pct(sp['sparsity'])}% | {pct(sp.get('by_weight'))}% |"

    a = gen.get("arithmetic")
    if a:
        rows.append(f"| basic arithmetic, {a['shots']}-shot greedy: exact match | {a['n']} | "
                    f"{pct(a['exact_match'])} ± {pct(a['exact_match_stderr'])} | {cells(a)}")
    g = gen.get("agreement")
    if g:
        rows.append(f"| agreement with the dense model ({g['reference']}): first {g['agree_tokens']} tokens | "
                    f"{g['n']} | {pct(g['token_agreement'])} | {cells(g)}")
        rows.append(f"| agreement with the dense model: identical answers | {g['n']} | {pct(g['exact_match'])} | "
                    f"{cells(g)}")
    notes = ["", "- Token agreement: the share of the dense model's first answer tokens the routed model predicts "
                 "greedily on the dense answer's prefix; identical answers: free-running greedy answers."]
    if any(r.get("prefill") == "dense" for r in gen.values()):
        notes.append("- Prompts ran dense (`--gen-prefill dense`: routing off for the prompt, only the answer's decode "
                     "steps routed); the realized sparsity is the answer tokens'.")
    return rows + notes + [""]


def markdown_report(result: dict[str, Any]) -> str:
    """A header (model, method, checkpoint, target) and one row per measure, realized sparsity on each."""
    info, summary, settings = result["model"], result["summary"], result["settings"]
    routing = info.get("routing") or {}
    lines = [f"## wide eval: {info['model']} · {summary['method']}", ""]
    desc = [f"target sparsity {pct(summary['target_sparsity'])}%" if routing else "dense (no routing)"]
    if routing:
        desc.append(f"granularity `{routing['granularity']}`, router `{routing['router']}`")
        if routing["granularity"] == "width":
            desc.append(f"groups attn {routing['attn_group_size'] or 'gqa'} / ffn {routing['ffn_group_size']}")
    ckpt = info.get("checkpoint")
    if ckpt:
        adapter = ckpt.get("adapter")
        desc.append(f"checkpoint `{ckpt['path']}` (stage {ckpt['stage']}, step {ckpt['step']}"
                    + (f", {adapter['label']} merged" if adapter else "") + ")")
    elif info.get("untrained_router"):
        desc.append("**router untrained (random init)**")
    desc.append(f"{info['dtype']} on {result.get('hardware', {}).get('gpu') or info['device']}")
    lines += ["; ".join(desc) + ".", ""]
    lines += ["| measure | n | acc | acc_norm | score | realized sparsity |", "|---|---:|---:|---:|---:|---:|"]
    ppl = result.get("perplexity")
    if ppl:
        lines.append(f"| perplexity ({ppl['source']}, window {ppl['window']}, stride {ppl['stride']}) | "
                     f"{ppl['tokens']:,} tok | | | {ppl['ppl']:.3f} | {pct(ppl['sparsity']['sparsity'])}% |")
    for task, r in result["tasks"].items():
        acc = pct(r.get("acc")) if "acc" in r else ""
        norm = pct(r.get("acc_norm")) if "acc_norm" in r else ""
        lines.append(f"| {task} | {r['n']} | {acc} | {norm} | {pct(r['score'])} ± {pct(r[r['metric'] + '_stderr'])} |"
                     f" {pct(r['sparsity']['sparsity'])}% |")
    if result["tasks"]:
        lines.append(f"| **average ({len(result['tasks'])} tasks)** | | | | **{pct(summary['avg'])}** | "
                     f"{pct(summary['zeroshot_sparsity'])}% |")
    lines.append("")
    lines += _generative_rows(result.get("generative") or {})
    notes = ["score = acc_norm where lm-eval reports it (ARC, PIQA, OpenBookQA, HellaSwag), else acc (BoolQ, "
             "WinoGrande); ± is the binomial standard error.",
             "Realized sparsity: skipped fraction of (token, group) units, mean over routed layers and router "
             "kinds, token-weighted over the valid tokens of the forwards behind that row."]
    if settings.get("limit"):
        notes.append(f"Limited to the first {settings['limit']} items per task.")
    if settings.get("ppl_docs") and result.get("perplexity"):
        notes.append(f"Perplexity on the first {result['perplexity']['documents']} documents of its source "
                     "(--ppl-limit all: every document).")
    if any(r["split"] != r["lm_eval_split"] for r in result["tasks"].values()):
        notes.append("ARC and OpenBookQA are scored on their validation split (lm-eval: test).")
    by_kind = summary["sparsity"].get("by_kind") or {}
    if by_kind:
        notes.append("Realized sparsity by router kind over all forwards: "
                     + ", ".join(f"{k} {pct(v)}%" for k, v in by_kind.items()) + ".")
    lines += [f"- {n}" for n in notes]
    cross = result.get("lm_eval")
    if cross:
        lines += ["", f"lm-evaluation-harness {cross.get('lm_eval_version', '')} on the same items (cross-check):", "",
                  "| task | acc (wide / lm-eval) | acc_norm (wide / lm-eval) |", "|---|---:|---:|"]
        for task, r in result["tasks"].items():
            c = cross.get(task, {})
            cells = [f"{pct(r[m])} / {pct(c.get(m))}" if m in r else "" for m in ("acc", "acc_norm")]
            lines.append(f"| {task} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines) + "\n"
