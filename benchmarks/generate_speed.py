"""Decode speed through `wide.generate` (CUDA-graph replayed steps) on both sides, with HF `generate` beside it.

Llama-3.1-8B shape with random bf16 weights (or ``--model``), ``--router`` routers at ``--sparsity`` with `wide
bench`'s groups (FFN 128; until 2026-12-02 this script took WideConfig's 64), glue fused on both sides
(``wide.fuse_glue``). Per batch: ms per new token (median of ``--reps`` runs of ``--new`` tokens after a
``--prompt``-token prefill, the prefill excluded by subtracting a 1-token run), dense and routed, and HF ``generate``
(eager decode steps, its static-cache auto-compile off) for reference. Steady state: the time of
``--new`` tokens minus that of 3 (prefill, the eager first step and the capture), over ``new - 3`` tokens; each
``wide.generate`` call captures its step graph once (its cost is reported apart).

    PYTHONPATH=. python3 benchmarks/generate_speed.py --batch 1 16 --json generate_speed.json
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import common  # noqa: E402


def per_token_ms(fn, new: int, reps: int) -> tuple[float, float]:
    """Median ms per steady-state decode token ((time of ``new`` tokens - time of 3) / (new - 3)) and the
    median time of a 3-token call (prefill + eager step + capture + one replay)."""
    def run(n):
        common.sync()
        t0 = time.perf_counter()
        fn(n)
        common.sync()
        return (time.perf_counter() - t0) * 1e3
    run(new)  # warm-up: kernels, compiles
    pairs = [(run(new), run(3)) for _ in range(reps)]
    return statistics.median((a - b) / (new - 3) for a, b in pairs), statistics.median(b for _, b in pairs)


def main(argv=None) -> None:
    ap = common.parser(__doc__, device=None, shape="llama-8b", layers=True)
    ap.add_argument("--model", default=None, help="a local model / asset instead of --shape")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--coherent", action="store_true", help="routed side with batch-coherent decode")
    common.add_routing_args(ap)
    args = ap.parse_args(argv)
    if args.new <= 3:
        raise SystemExit("generate_speed.py: --new must be more than 3 (the steady state is new - 3 tokens)")
    device, dtype = common.setup(args)

    import wide
    from wide.bench.models import random_ids

    model = common.load_model(args.model, args.shape, args.layers, device, dtype)
    model.generation_config.disable_compile = True
    wide.fuse_glue(model)
    prompts = {b: random_ids(model, (b, args.prompt), device) for b in args.batch}

    def timings(label):
        for b, ids in prompts.items():
            ours, ours3 = per_token_ms(lambda n: wide.generate(model, ids, max_new_tokens=n), args.new, args.reps)
            hf, hf3 = per_token_ms(lambda n: model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                                                       min_new_tokens=n, do_sample=False), args.new, args.reps)
            rows.append((label, b, ours, hf))
            print(f"{label:8s} batch {b:3d}: wide.generate {ours:7.2f} ms/token ({ours3:.0f} ms for 3 tokens)   "
                  f"HF generate {hf:7.2f} ms/token ({hf3:.0f} ms for 3 tokens)", flush=True)

    rows: list = []
    timings("dense")
    common.route(model, args.sparsity, args.router, args.ffn_group_size, args.attn_group_size, fuse_glue=True,
                 coherent=args.coherent)
    timings("routed")
    lines = [f"sparsity {args.sparsity}{' coherent' if args.coherent else ''}, prompt {args.prompt}, {args.new} new "
             f"tokens, {model.config.num_hidden_layers} layers; ms per new token, dense / routed (ratio)", "",
             "| batch | wide.generate | HF generate |", "|---|---|---|"]
    table = []
    for b in args.batch:
        d = next(r for r in rows if r[0] == "dense" and r[1] == b)
        r = next(r for r in rows if r[0] == "routed" and r[1] == b)
        table.append(dict(batch=b, dense_ms=d[2], routed_ms=r[2], hf_dense_ms=d[3], hf_routed_ms=r[3]))
        lines.append(f"| {b} | {d[2]:.2f} / {r[2]:.2f} ({d[2] / r[2]:.2f}x) | {d[3]:.2f} / {r[3]:.2f} "
                     f"({d[3] / r[3]:.2f}x) |")
    common.report(args, {"args": vars(args), "rows": table}, "\n".join(lines), device)


if __name__ == "__main__":
    main()
