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

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def wall_ms(fn, reps: int) -> float:
    def once():
        _sync()
        t0 = time.perf_counter()
        fn()
        _sync()
        return (time.perf_counter() - t0) * 1e3
    once()  # warm-up: kernels, captures
    return statistics.median(once() for _ in range(reps))


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


def main() -> None:
    import wide
    from wide.bench.models import build_model, random_ids
    from wide.bench.synthetic import set_synthetic_rate
    from wide.modeling.inference import enable_kernels

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--sparsity", type=float, default=0.5)
    ap.add_argument("--prompts", type=int, nargs="+", default=[300, 700, 1500, 3000])
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--chunks", type=int, nargs="+", default=None, help="the Generator's chunk sizes (default: its own)")
    args = ap.parse_args()

    torch.manual_seed(0)
    model = build_model(args.model, args.layers, "cuda", torch.bfloat16)
    model.generation_config.disable_compile = True
    wide.fuse_glue(model)
    prompts = {t: random_ids(model, (1, t), "cuda") for t in args.prompts}
    cache_len = -(-(max(args.prompts) + args.new) // 1024) * 1024
    dense = measure(model, prompts, args.new, args.reps, cache_len, args.chunks)
    torch.cuda.empty_cache()
    wide.apply_wide(model, wide.WideConfig(sparsity=args.sparsity, router="random", ffn_group_size=128))
    model.eval()
    enable_kernels(model, "triton")
    wide.fuse_glue(model)
    set_synthetic_rate(model, "random", args.sparsity)
    routed = measure(model, prompts, args.new, args.reps, cache_len, args.chunks)

    keys = [k for k in next(iter(dense.values())) if k != "plan"]
    print("| prompt | routed Generator chunks | " + " | ".join(f"{k} dense / routed ms (ratio)" for k in keys) + " |")
    print("|---|---|" + "---|" * len(keys))
    for t in args.prompts:
        cells = [f"{dense[t][k]:.1f} / {routed[t][k]:.1f} ({dense[t][k] / routed[t][k]:.2f}x)" for k in keys]
        print(f"| {t} | {routed[t]['plan'] or 'one eager forward'} | " + " | ".join(cells) + " |")
    best = {t: min(dense[t]["ttft generate"], dense[t]["ttft Generator"]) for t in args.prompts}
    print("routed Generator TTFT against the faster dense path: " + ", ".join(
        f"{t}: {best[t] / routed[t]['ttft Generator']:.2f}x" for t in args.prompts))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, sparsity {args.sparsity}, layers "
          f"{model.config.num_hidden_layers}, chunk sizes {args.chunks or 'default'}")


if __name__ == "__main__":
    main()
