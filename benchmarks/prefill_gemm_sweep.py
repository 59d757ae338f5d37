"""Prefill-sized routed gemm_mn / SwiGLU configs (M = 4096 tokens by default) on one model's layer shapes
(``--shape``: Llama-3.1-8B by default; Qwen2.5-1.5B and SmolLM2-135M, whose hidden sizes of 1536 / 576 leave the
8B-tuned tiles a short K loop and few tiles per wave, get narrower candidates too), against cuBLAS: the
permuted-tile kernel (one program per tile) and the persistent one over the active-tile list
(``GemmConfig.persistent``). TMA weight descriptors, Triton's flattened loops and warp specialization were
swept on 2026-12-01 and lost (BENCHMARKS.md); the kernel no longer takes them.

Masks: random at densities 0.5 and 1.0 (every group on: the kernel's rate on dense work). ``triton.testing.do_bench``
medians (L2 flushed between calls). Prints per case the six fastest configs and the default (``None``), each
with its time, its rate against cuBLAS at equal work (``cuBLAS us x density / us``) and its error against the
torch reference; a config the shape or the GPU does not take prints its error.

    PYTHONPATH=. python3 benchmarks/prefill_gemm_sweep.py              # H200: ~3 min (most of it compiling)
    PYTHONPATH=. python3 benchmarks/prefill_gemm_sweep.py --m 16384 --ops gate_up
    PYTHONPATH=. python3 benchmarks/prefill_gemm_sweep.py --m 4096 16384 --ops up_proj --wide   # the kernel table's gemm_mn rows
    PYTHONPATH=. python3 benchmarks/prefill_gemm_sweep.py --shape qwen2.5-1.5b --m 4096 --ops q_proj,gate_up
"""
import itertools
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import common  # noqa: E402
from benchmarks.common import bench_ms as bench_eager, print_fastest, time_candidate  # noqa: E402
from wide.kernels import get_backend, make_plan  # noqa: E402
from wide.kernels.triton.common import GemmConfig as C  # noqa: E402

DT, DEV = torch.bfloat16, "cuda"
FFN_GROUP = 128  # the FFN groups `wide bench` times (its --ffn-group-size default) and the kernel table's rows


def layer_shapes(shape: str) -> dict[str, tuple[str, int, int, int]]:
    """The routed prefill GEMMs of a ``--shape`` preset: name -> (op, N, K, group). q_proj's groups are GQA-aligned
    (the query heads of one KV head: 512 channels on the 8B shape, 768 on Qwen2.5-1.5B, 192 on SmolLM2); up_proj is
    the kernel table's gemm_mn row (the up weight alone, FFN groups of 128)."""
    cfg = common.shape_config(shape)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    q_group = cfg.num_attention_heads // cfg.num_key_value_heads * head_dim
    d, f = cfg.hidden_size, cfg.intermediate_size
    return {"q_proj": ("gemm_mn", cfg.num_attention_heads * head_dim, d, q_group),
            "gate_up": ("swiglu", f, d, FFN_GROUP), "up_proj": ("gemm_mn", f, d, FFN_GROUP)}


def candidates(op: str, group: int, wide: bool, narrow: bool = False) -> list:
    """``(kernel, GemmConfig)`` candidates after the default (``None``); ``narrow``: a short K loop (hidden <= 2048),
    where fewer warps, smaller tiles and a shallower K step may fill the SMs better. Only tiles that divide a group."""
    P = lambda *a, **k: ("perm", C(*a, persistent=k.pop("persistent", 1), **k))  # noqa: E731
    out = [P(128, 128, 64, 8, st) for st in (3, 4)]
    if op == "gemm_mn":
        out += [P(256, 128, 64, 8, 3)]
    if op == "gemm_mn" and group >= 256:  # q's groups (4 heads of 128) take 256-wide tiles
        out += [P(128, 256, 64, 8, st) for st in (3, 4)]
        out += [P(64, 256, 64, 4, 3, persistent=2)]
    if narrow:
        out += [P(bm, bn, 64, 4, st) for bm, bn in ((64, 128), (128, 64), (64, 64)) for st in (3, 4)]
        out += [P(128, 128, 32, 4, 4), P(128, 64, 32, 4, 4)]
        out += [("perm", C(bm, bn, 64, 4, 3)) for bm, bn in ((64, 128), (128, 64))]
    if wide:  # one program per tile (the kernel before the persistent one), and other tile depths
        out += [("perm", C(bm, 128, 64, 8, st)) for bm in (128, 256) for st in (3, 4)]
        out += [P(128, 128, bk, 8, st) for bk, st in ((32, 4), (128, 2))]
    return [None] + [c for c in out if group % c[1].block_n == 0]


def main(argv=None):
    ap = common.parser(__doc__, device=None, dtype=None, shape="llama-8b", outputs=False)
    ap.add_argument("--m", type=int, nargs="+", default=[4096])
    ap.add_argument("--ops", default="q_proj,gate_up")
    ap.add_argument("--densities", type=float, nargs="+", default=[0.5, 1.0])
    ap.add_argument("--wide", action="store_true", help="also one program per tile and other tile depths")
    args = ap.parse_args(argv)
    shapes = layer_shapes(args.shape)
    bad = [o for o in args.ops.split(",") if o not in shapes]
    if bad:
        raise SystemExit(f"prefill_gemm_sweep.py: --ops takes {', '.join(shapes)}, got {', '.join(bad)}")
    common.setup(args)
    tb, rb = get_backend("triton"), get_backend("torch")
    print(common.meta_line(common.meta()) + f"\nbf16, {args.shape}", flush=True)
    for M, name in itertools.product(args.m, args.ops.split(",")):
        op, N, K, group = shapes[name]
        x = torch.randn(M, K, device=DEV, dtype=DT)
        w = torch.randn(N, K, device=DEV, dtype=DT) / K ** 0.5
        w2 = torch.randn(N, K, device=DEV, dtype=DT) / K ** 0.5 if op == "swiglu" else None
        if op == "swiglu":
            wgu = torch.cat([w, w2])
            dense_us = 1e3 * bench_eager(lambda: F.linear(x, wgu))
        else:
            dense_us = 1e3 * bench_eager(lambda: F.linear(x, w))
        for d in args.densities:
            gen = torch.Generator(device=DEV).manual_seed(7)
            mask = torch.rand(M, N // group, generator=gen, device=DEV) < d
            plan = make_plan(mask).materialize(flat=True)
            ref = rb.swiglu(x, w, w2, mask) if op == "swiglu" else rb.gemm_mn(x, w, mask)
            results = []
            for cfg in candidates(op, group, args.wide, narrow=K <= 2048):
                def setup(cfg=cfg):
                    if op == "swiglu":
                        fn = lambda: tb.swiglu(x, w, w2, mask, plan=plan, config=cfg)  # noqa: E731
                    else:
                        fn = lambda: tb.gemm_mn(x, w, mask, plan=plan, config=cfg)  # noqa: E731
                    return fn(), ref, lambda: 1e3 * bench_eager(fn)
                time_candidate(results, cfg, setup)
            print(f"\n{name} [{N}, {K}] groups of {group}, M={M} density {d}: cuBLAS (all groups) {dense_us:.1f} us",
                  flush=True)
            print_fastest(results, lambda us, c, err: f"  {us:8.1f} us  rate {dense_us * d / us:5.2f}  "
                                                      f"err {err}  {c}", keep=8)


if __name__ == "__main__":
    main()
