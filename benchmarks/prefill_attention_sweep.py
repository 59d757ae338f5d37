"""Routed prefill attention configs against dense SDPA at one head shape, measured in one run.

Why: SmolLM2-135M's routed 4k prefill is slower than dense (profile_prefill.py --shape smollm2-135m, 2026-12-06:
routed attention 2.26 ms against SDPA's 2.08 ms over 30 layers at half the head groups skipped), and the
``D <= 64`` config of `wide.kernels.triton.attention.default_prefill_config` was never swept. This times the
default (label ``None``) and a grid of (block_m, block_n, warps, stages) at ``--density`` of active head groups,
next to SDPA flash / cuDNN on every head, and prints both absolute times and the ratios.

    python benchmarks/prefill_attention_sweep.py --hq 9 --hk 3 --d 64 --tokens 4096      # SmolLM2-135M
    python benchmarks/prefill_attention_sweep.py --hq 32 --hk 8 --d 128 --tokens 4096    # the 8B shape
    python benchmarks/prefill_attention_sweep.py --hq 12 --hk 2 --d 128 --pack           # Qwen2.5-1.5B, packed too

``--pack`` adds every grid config again with ``AttentionConfig.pack`` (a unit's heads in as many tile rows, not a
power of two: 3 or 6 heads a unit leave a quarter of each padded tile dead), labelled ``pack=True``.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import common  # noqa: E402
from wide.kernels.triton.attention import AttentionConfig as A  # noqa: E402

# the default (None) first, then every (block_m, block_n, warps, stages) of the grid: 37 candidates
CANDIDATES = [None] + [A(block_m=m, block_n=n, num_warps=w, num_stages=s)
                       for m, n, w, s in itertools.product((64, 128), (32, 64, 128), (4, 8), (2, 3, 4))]


def candidates(pack: bool) -> list:
    """`CANDIDATES`, and with ``pack`` each grid config packed too (73 candidates)."""
    return CANDIDATES + ([dataclasses.replace(c, pack=True) for c in CANDIDATES[1:]] if pack else [])


def main(argv=None) -> None:
    from benchmarks.kernel_table import sdpa_fn  # the kernel table's dense side, one SDPA backend forced
    from wide.kernels import get_backend, make_plan

    ap = common.parser(__doc__, device=None, dtype=None, outputs=False)
    ap.add_argument("--hq", type=int, default=9, help="query heads (default: SmolLM2-135M's 9)")
    ap.add_argument("--hk", type=int, default=3, help="key / value heads, one routing group each (default: 3)")
    ap.add_argument("--d", type=int, default=64, help="head dim (default: 64)")
    ap.add_argument("--tokens", type=int, nargs="+", default=[4096])
    ap.add_argument("--density", type=float, nargs="+", default=[0.5, 1.0], help="shares of active head groups")
    ap.add_argument("--keep", type=int, default=6, help="print the N fastest candidates (and the default)")
    ap.add_argument("--pack", action="store_true", help="also each grid config with a unit's heads packed")
    args = ap.parse_args(argv)
    if args.hq % args.hk:
        raise SystemExit(f"prefill_attention_sweep: --hq ({args.hq}) must be a multiple of --hk ({args.hk})")
    common.setup(args)
    dev, dt = torch.device("cuda"), torch.bfloat16
    tb = get_backend("triton")
    gsize = args.hq // args.hk
    print(common.meta_line(common.meta(dev)))
    for T in args.tokens:
        q = torch.randn(1, T, args.hq, args.d, device=dev, dtype=dt)
        k = torch.randn(1, args.hk, T, args.d, device=dev, dtype=dt)
        v = torch.randn(1, args.hk, T, args.d, device=dev, dtype=dt)
        qh = q.transpose(1, 2).contiguous()
        dense = {}
        for name in ("flash", "cudnn"):
            fn = sdpa_fn(qh, k, v, True, name)
            try:
                fn()
                dense[name] = common.bench_ms(fn) * 1e3
            except Exception as e:  # noqa: BLE001 - a backend this build lacks
                print(f"T={T} dense sdpa-{name}: {type(e).__name__}")
        if not dense:
            raise SystemExit(f"prefill_attention_sweep: no SDPA backend ran at T={T} (see above)")
        best = min(dense.values())
        print(f"T={T} hq={args.hq} hk={args.hk} d={args.d}: dense " +
              ", ".join(f"sdpa-{n} {t:.1f} us" for n, t in dense.items()), flush=True)
        ref_all = F.scaled_dot_product_attention(qh, k, v, is_causal=True, enable_gqa=True).transpose(1, 2)
        kt, vt = k.transpose(1, 2), v.transpose(1, 2)
        for density in args.density:
            gen = torch.Generator(device=dev).manual_seed(T)
            mask = torch.rand(1, T, args.hk, device=dev, generator=gen) < density
            plan = make_plan(mask).materialize(flat=False)
            ref = ref_all * mask.repeat_interleave(gsize, -1)[..., None]
            results: list = []
            for cfg in candidates(args.pack):
                def setup(cfg=cfg):
                    run = lambda: tb.attention_prefill(q, kt, vt, mask, plan=plan, config=cfg)  # noqa: E731
                    return run(), ref, lambda: common.bench_ms(run) * 1e3
                common.time_candidate(results, cfg, setup)
            print(f"  density {density:.2f} (routed at the default config: label None)")
            common.print_fastest(results, lambda t, c, err: f"    {t:8.1f} us  dense/routed {best / t:5.2f}x  "
                                                            f"err {err}  {c}", keep=args.keep)


if __name__ == "__main__":
    main()
