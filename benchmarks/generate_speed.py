"""Decode speed through `wide.generate` (CUDA-graph replayed steps) on both sides, with HF `generate` beside it.

Llama-3.1-8B shape with random bf16 weights (or ``--model``), ``random`` routers at ``--sparsity``, glue fused on
both sides (``wide.fuse_glue``). Per batch: ms per new token (median of ``--reps`` runs of ``--new`` tokens after a
``--prompt``-token prefill, the prefill excluded by subtracting a 1-token run), dense and routed, and HF
``generate`` (eager decode steps, its static-cache auto-compile off) for reference. Steady state: the time of
``--new`` tokens minus that of 3 (prefill, the eager first step and the capture), over ``new - 3`` tokens; each
``wide.generate`` call captures its step graph once (its cost is reported apart).

    PYTHONPATH=. python3 benchmarks/generate_speed.py --layers 32 --batch 1 16
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def per_token_ms(fn, new: int, reps: int) -> tuple[float, float]:
    """Median ms per steady-state decode token ((time of ``new`` tokens - time of 3) / (new - 3)) and the
    median time of a 3-token call (prefill + eager step + capture + one replay)."""
    def run(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(n)
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e3
    run(new)  # warm-up: kernels, compiles
    pairs = [(run(new), run(3)) for _ in range(reps)]
    return statistics.median((a - b) / (new - 3) for a, b in pairs), statistics.median(b for _, b in pairs)


def main() -> None:
    import wide
    from wide.bench.models import build_model, random_ids
    from wide.modeling.inference import enable_kernels

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--sparsity", type=float, default=0.5)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--coherent", action="store_true", help="routed side with batch-coherent decode")
    args = ap.parse_args()

    torch.manual_seed(0)
    model = build_model(args.model, args.layers, "cuda", torch.bfloat16)
    model.generation_config.disable_compile = True
    wide.fuse_glue(model)
    prompts = {b: random_ids(model, (b, args.prompt), "cuda") for b in args.batch}

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
    wide.apply_wide(model, wide.WideConfig(sparsity=args.sparsity, router="random"))
    model.eval()
    enable_kernels(model)
    wide.fuse_glue(model)
    for wl in wide.modeling.runtime_of(model).layers:
        for r in wl.routers.values():
            r.rate = args.sparsity
    if args.coherent:
        wide.set_coherent_decode(model, 1)
    timings("routed")
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, sparsity {args.sparsity}"
          f"{' coherent' if args.coherent else ''}, prompt {args.prompt}, {args.new} new tokens")
    for b in args.batch:
        d = next(r for r in rows if r[0] == "dense" and r[1] == b)
        r = next(r for r in rows if r[0] == "routed" and r[1] == b)
        print(f"batch {b}: dense/routed through wide.generate {d[2] / r[2]:.2f}x, through HF generate {d[3] / r[3]:.2f}x")


if __name__ == "__main__":
    main()
