"""Where a CUDA-graph-replayed decode step spends its GPU time, kernel by kernel, dense vs routed.

The rows `wide bench` times: the Llama-3.1-8B-shaped model (random bf16 weights, ``--layers`` of them), a
static cache at a ``--context``-token context, one decode step of ``--batch`` rows captured in a CUDA graph
and replayed. Dense side: sdpa over the filled part of the cache with cuDNN (the bench's strongest dense
decode, ``sliced-cudnn``); routed side: ``random`` routers at ``--sparsity`` on the triton backend. Both
sides with ``wide.fuse_glue`` unless ``--no-fuse-glue``. torch.profiler records the kernels of the replays
(CUPTI traces graph nodes); the table lists each kernel's GPU time per layer, the wall time per step, and
their gap (the GPU idle between kernels that a graph does not remove: launch latency, tails).

    PYTHONPATH=. python3 benchmarks/profile_decode.py --batch 1 --layers 8
    PYTHONPATH=. python3 benchmarks/profile_decode.py --batch 1 --router lowrank --no-overlap-routing \
        --kernel-option decode_norm_route=1    # a decode step's norms fused with their routers
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import common  # noqa: E402


def kernel_table(step, iters: int) -> tuple[float, dict[str, tuple[float, int]]]:
    """(wall ms per step, {kernel name: (GPU ms per step, launches per step)}) over ``iters`` replays."""
    from benchmarks.profile_prefill import profiled

    wall, p = profiled(step, iters, warmup=3)
    times: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for e in p.events():
        if e.device_type.name == "CUDA" and e.device_time_total:
            times[e.name] += e.device_time_total / 1e3 / iters
            counts[e.name] += 1
    return wall, {k: (times[k], counts[k] // iters) for k in times}


def main(argv=None) -> None:
    ap = common.parser(__doc__, device=None, shape="llama-8b", layers=8, outputs=False, kernel_options=True)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--coherent", action="store_true")
    ap.add_argument("--no-fuse-glue", action="store_true")
    ap.add_argument("--no-overlap-routing", action="store_true",
                    help="the attention router on the main stream (as `wide bench --no-overlap-routing`)")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--weight-layout", choices=["row", "column"], default="row",
                    help="the routed model's o_proj / down_proj weights (wide.set_weight_layout)")
    common.add_routing_args(ap)
    args = ap.parse_args(argv)
    device, dtype = common.setup(args)

    from torch.nn.attention import SDPBackend, sdpa_kernel

    import wide
    from wide.bench.dense import SLICED, use_attention
    from wide.kernels import use_kernel_options
    from wide.bench.runners import DecodeRunner

    model = common.random_model(args.shape, args.layers, device, dtype)
    if not args.no_fuse_glue:
        wide.fuse_glue(model)
    with use_attention(model, SLICED, keys=args.context + 1):
        runner = DecodeRunner(model, args.batch, args.context, True,
                              attn_ctx=lambda: sdpa_kernel([SDPBackend.CUDNN_ATTENTION]))
        assert runner.mode == "graph", runner.mode
        results = {"dense (sliced cuDNN sdpa)": kernel_table(runner.step, args.iters)}
        del runner

    common.route(model, args.sparsity, args.router, args.ffn_group_size, args.attn_group_size,
                 fuse_glue=not args.no_fuse_glue, coherent=args.coherent)
    wide.set_overlap_routing(model, not args.no_overlap_routing)
    wide.set_weight_layout(model, args.weight_layout)
    with use_kernel_options(common.kernel_options_of(args)):  # captured under them
        runner = DecodeRunner(model, args.batch, args.context, True)
        assert runner.mode == "graph", runner.mode
        results[f"routed ({'coherent' if args.coherent else 'per-token'}, {args.sparsity:.0%})"] = \
            kernel_table(runner.step, args.iters)

    print(common.meta_line(common.meta(device)))
    L = args.layers
    print(f"decode step, batch {args.batch}, context {args.context}, {L} layers of the {args.shape} shape, "
          f"{args.dtype}, "
          f"CUDA graph replay, glue {'not ' if args.no_fuse_glue else ''}fused, routed o_proj / down_proj weights "
          f"{args.weight_layout}-major; per layer = per step / {L}")
    for name, (wall, table) in results.items():
        gpu = sum(t for t, _ in table.values())
        launches = sum(c for _, c in table.values())
        print(f"\n{name}: wall {wall * 1e3 / L:.1f} us/layer, summed kernel time {gpu * 1e3 / L:.1f} us/layer, "
              f"idle between kernels {(wall - gpu) * 1e3 / L:.1f} us/layer, {launches / L:.1f} kernels/layer")
        for k, (t, c) in sorted(table.items(), key=lambda kv: -kv[1][0])[:args.top]:
            print(f"  {t * 1e3 / L:8.2f} us/layer  {c / L:5.2f}x  {k[:110]}")
    walls = [w for w, _ in results.values()]
    print(f"\ndense/routed wall: {walls[0] / walls[1]:.2f}x")


if __name__ == "__main__":
    main()
