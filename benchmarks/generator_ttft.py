"""Time to first token and whole requests through `wide.Generator` (graphs kept across calls) and `wide.generate`.

Llama-3.1-8B shape with random bf16 weights (or ``--model``), ``random`` routers at ``--sparsity``, glue fused on
both sides (``wide.fuse_glue``), batch 1. Per prompt length: the wall time (host included, synchronized) of a call
that returns the first new token (``max_new_tokens=1``: the prefill and one argmax) and of a call that adds ``--new``
tokens, each the median of ``--reps`` calls after one warm-up call (the Generator's captures happen there, once per
chunk size and for the decode step). `wide.generate` prefills eagerly in one forward and captures its decode step
in every call; `wide.Generator` (default chunk sizes 1024 / 512 / 256 / 128) replays: the routed model chunks every prompt, the
dense one prompts from 2048 tokens as one eager forward (its default ``whole_from``). Dense and routed run the same
two paths.

    PYTHONPATH=. python3 benchmarks/generator_ttft.py --prompts 300 700 1500 3000
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import common  # noqa: E402
from benchmarks.common import wall_ms  # noqa: E402  (one warm-up call: the Generator's captures happen there)


def measure(model, prompts: dict, new: int, reps: int, max_cache_len: int, chunk=None) -> dict:
    import wide
    from wide.modeling.generate import DEFAULT_CHUNKS

    gen = wide.Generator(model, batch_size=1, max_cache_len=max_cache_len, chunk=chunk or DEFAULT_CHUNKS)
    out = {}
    for t, ids in prompts.items():
        out[t] = {
            "ttft generate": wall_ms(lambda: wide.generate(model, ids, max_new_tokens=1), reps),
            "ttft Generator": wall_ms(lambda: gen.generate(ids, max_new_tokens=1), reps),
            f"+{new} generate": wall_ms(lambda: wide.generate(model, ids, max_new_tokens=new), reps),
            f"+{new} Generator": wall_ms(lambda: gen.generate(ids, max_new_tokens=new), reps),
            "plan": gen.plan(t),
        }
    return out


def main(argv=None) -> None:
    ap = common.parser(__doc__, shape="llama-8b", layers=True)
    ap.add_argument("--model", default=None, help="a local model / asset instead of --shape")
    ap.add_argument("--prompts", type=int, nargs="+", default=[300, 700, 1500, 3000])
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--chunks", type=int, nargs="+", default=None, help="the Generator's chunk sizes (default: its own)")
    common.add_routing_args(ap)
    args = ap.parse_args(argv)
    device, dtype = common.setup(args)

    import wide
    from wide.bench.models import random_ids

    model = common.load_model(args.model, args.shape, args.layers, device, dtype)
    model.generation_config.disable_compile = True
    wide.fuse_glue(model)
    prompts = {t: random_ids(model, (1, t), device) for t in args.prompts}
    cache_len = -(-(max(args.prompts) + args.new) // 1024) * 1024
    dense = measure(model, prompts, args.new, args.reps, cache_len, args.chunks)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    common.route(model, args.sparsity, args.router, args.ffn_group_size, args.attn_group_size,
                 backend="triton" if device.type == "cuda" else None, fuse_glue=True)
    routed = measure(model, prompts, args.new, args.reps, cache_len, args.chunks)

    keys = [k for k in next(iter(dense.values())) if k != "plan"]
    lines = [f"sparsity {args.sparsity}, layers {model.config.num_hidden_layers}, chunk sizes "
             f"{args.chunks or 'default'}, batch 1", "",
             "| prompt | routed Generator chunks | "
             + " | ".join(f"{k} dense / routed ms (ratio)" for k in keys) + " |",
             "|---|---|" + "---|" * len(keys)]
    for t in args.prompts:
        cells = [f"{dense[t][k]:.1f} / {routed[t][k]:.1f} ({dense[t][k] / routed[t][k]:.2f}x)" for k in keys]
        lines.append(f"| {t} | {routed[t]['plan'] or 'one eager forward'} | " + " | ".join(cells) + " |")
    best = {t: min(dense[t]["ttft generate"], dense[t]["ttft Generator"]) for t in args.prompts}
    lines += ["", "routed Generator TTFT against the faster dense path: " + ", ".join(
        f"{t}: {best[t] / routed[t]['ttft Generator']:.2f}x" for t in args.prompts)]
    common.report(args, {"args": vars(args), "dense": dense, "routed": routed}, "\n".join(lines), device)


if __name__ == "__main__":
    main()
