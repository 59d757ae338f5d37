"""Where routed prefill time goes: torch.profiler tables for dense vs routed, same model, one run.

Builds the ``wide bench`` Llama-3.1-8B-shaped model (random bf16 weights, ``--layers`` of them),
times a batch-1 prefill of ``--tokens`` tokens dense and then routed (synthetic masks at
``--sparsity``), and prints for each the GPU time per op family (kernel names grouped) and the
gap between wall time and summed GPU time (launch / host overhead, host syncs). ``--decode B`` profiles
instead one eager decode step of B rows after a ``--tokens`` context (dynamic cache): the GPU time per
op family is what a CUDA graph replays, the host gap is what it removes.

    python benchmarks/profile_prefill.py --tokens 4096 --sparsity 0.5 --layers 8
    python benchmarks/profile_prefill.py --tokens 4096 --sparsity 0.5 --layers 8 --decode 1
    python benchmarks/profile_prefill.py --tokens 4096 --sparsity 0.5 --layers 8 --decode 16 --coherent
    python benchmarks/profile_prefill.py --tokens 4096 --sparsity 0.5 --layers 8 --fuse-glue --router lowrank
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import common  # noqa: E402


def family(name: str) -> str:
    n = name.lower()
    for key, label in (("gemm_mn", "routed gemm_mn/swiglu"), ("swiglu", "routed gemm_mn/swiglu"),
                       ("gemm_k", "routed gemm_k"),
                       ("mask_columns", "routed gemm_k"), ("_prefill_kernel", "routed attention"),
                       ("_decode_split", "routed attention"), ("_decode_reduce", "routed attention"),
                       ("partition", "routing plan"), ("_router_margin", "routing decision"),
                       ("_coherent", "routing decision"),
                       ("flash", "dense attention"), ("fmha", "dense attention"), ("cudnn", "dense attention"),
                       ("gemm", "cuBLAS GEMM"), ("gemv", "cuBLAS GEMM"), ("nvjet", "cuBLAS GEMM"),
                       ("cutlass", "cuBLAS GEMM"), ("mask_epilogue", "routed gemm_mn/swiglu")):
        if key in n:
            return label
    return "elementwise / other"


def profiled(fn, iters: int, warmup: int = 2):
    """``(wall ms per call, torch.profiler)`` of ``iters`` calls of ``fn`` after ``warmup`` unprofiled ones
    (CUDA events around the profiled calls; benchmarks/profile_decode.py uses it too)."""
    from torch.profiler import ProfilerActivity, profile as prof

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with prof(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
    return start.elapsed_time(end) / iters, p


def profile(fn, iters: int):
    wall, p = profiled(fn, iters)
    groups: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for e in p.key_averages():
        t = getattr(e, "device_time_total", 0.0) or getattr(e, "cuda_time_total", 0.0)
        if t and e.device_type.name == "CUDA":
            groups[family(e.key)] += t / 1e3 / iters
            count[family(e.key)] += e.count // iters
    syncs = sum(e.count for e in p.key_averages() if e.key in ("cudaStreamSynchronize", "cudaDeviceSynchronize",
                                                                 "aten::item", "aten::_local_scalar_dense")) // iters
    return wall, dict(groups), dict(count), syncs


def main(argv=None) -> None:
    ap = common.parser(__doc__, device=None, shape="llama-8b", layers=8, outputs=False)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--decode", type=int, default=0, help="profile a decode step of this many rows instead")
    ap.add_argument("--cprofile", action="store_true", help="also print the routed forward's host hot spots")
    ap.add_argument("--coherent", action="store_true", help="with --decode: batch-coherent decode routing")
    ap.add_argument("--fuse-glue", action="store_true", help="both sides with wide.fuse_glue (compiled norms / RoPE)")
    common.add_routing_args(ap)
    args = ap.parse_args(argv)
    device, dtype = common.setup(args)

    import wide
    from wide.bench.models import random_ids

    model = common.random_model(args.shape, args.layers, device, dtype)
    if args.fuse_glue:
        wide.fuse_glue(model)
    ids = random_ids(model, (1, args.tokens), device)

    state: dict = {}

    def fn():
        with torch.inference_mode():
            model(input_ids=ids, logits_to_keep=1, use_cache=False)

    if args.decode:
        from transformers import DynamicCache

        from wide.modeling.generate import cache_kwarg

        kw = cache_kwarg(model)
        ids = random_ids(model, (args.decode, args.tokens), device)
        new = random_ids(model, (args.decode, 1), device)

        def fn():  # noqa: F811 - the decode variant
            with torch.inference_mode():
                if "cache" not in state:
                    state["cache"] = DynamicCache(config=model.config)
                    model(input_ids=ids, **{kw: state["cache"]}, use_cache=True, logits_to_keep=1)
                model(input_ids=new, **{kw: state["cache"]}, use_cache=True)
                state["cache"].crop(-1)

    results = {"dense": profile(fn, args.iters)}
    common.route(model, args.sparsity, args.router, args.ffn_group_size, args.attn_group_size,
                 fuse_glue=args.fuse_glue, coherent=args.coherent)
    state.clear()
    results["routed"] = profile(fn, args.iters)

    if args.cprofile:
        import cProfile
        import pstats

        pr = cProfile.Profile()
        pr.enable()
        for _ in range(args.iters):
            fn()
        torch.cuda.synchronize()
        pr.disable()
        print(f"routed host hot spots ({args.iters} forwards):")
        pstats.Stats(pr).sort_stats("tottime").print_stats(25)

    what = (f"decode step ({'coherent' if args.coherent else 'per-token'} routing), batch {args.decode}, context"
            if args.decode else "prefill")
    print(common.meta_line(common.meta(device)))
    print(f"{what} T={args.tokens}, {args.layers} layers of the {args.shape} shape, {args.dtype}, "
          f"sparsity {args.sparsity}"
          + (", glue fused (wide.fuse_glue)" if args.fuse_glue else ""))
    for name, (wall, groups, count, syncs) in results.items():
        gpu = sum(groups.values())
        print(f"\n{name}: wall {wall:.2f} ms, summed GPU time {gpu:.2f} ms, host gap {wall - gpu:.2f} ms, "
              f"host syncs per forward {syncs}")
        for g, t in sorted(groups.items(), key=lambda kv: -kv[1]):
            print(f"  {g:28s} {t:8.2f} ms  {count[g]:5d} launches")
    print(f"\ndense/routed wall: {results['dense'][0] / results['routed'][0]:.2f}x")


if __name__ == "__main__":
    main()
