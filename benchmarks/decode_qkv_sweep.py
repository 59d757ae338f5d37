"""Launch configs of `wide.kernels.decode_qkv` (a batch-1 decode step's q / k / v GEMVs, RoPE and cache write in one
launch) on three models' attention shapes, against cuBLAS reading the same bytes.

2026-12-03 H200 profiles put the 8B shape's launch at 23 µs for 48 MB of q / k / v weights (≈ 2.1 TB/s of the
device's 4.4): one program per (head, reduction share), two programs per SM in all by default, so about one and a
half waves of 256 KB programs. This sweeps the share count (``split``), the reduction chunk (``block_k``) and the
warps per program, for every q head computed (``mask`` none: the launch beside the side-stream router) and for half of
them (a 50% mask: the router decided first), and prints the six fastest and the default (``None``) per case, with the
bytes each call reads over its time; then `KernelOptions.decode_qkv_split`'s pair of launches (k / v, then the
masked q heads) at their default configs. The baseline is one cuBLAS GEMV over the concatenated q / k / v weights (the
same bytes; no RoPE, no cache write). Each timed call reads another of 8 weight copies (the 50 MB L2 would otherwise
hold them), CUDA graph of 3 x 8 calls, median of 30 replays.

    PYTHONPATH=. python3 benchmarks/decode_qkv_sweep.py [--json out.json]
"""
import itertools
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import common  # noqa: E402
from benchmarks.common import graph_ms, print_fastest, time_candidate  # noqa: E402

COPIES = 8
SHAPES = {  # name: (hidden K, q heads, kv heads, head dim, biases)
    "llama-8b": (4096, 32, 8, 128, False), "qwen2.5-1.5b": (1536, 12, 2, 128, True),
    "smollm2-135m": (576, 9, 3, 64, False)}
# (each config compiles once per shape and mask mode: ~200 compiles, a few minutes on the H200)
CONFIGS = [None] + [(sp, bk, w) for sp, bk, w in itertools.product((2, 4, 8, 16, 32), (64, 128), (4, 8))]
# the software pipeline's depth (triton's default: 3) around the defaults' 128-wide chunks and 8 warps, and 256-wide
# chunks (2026-12-04: the 8B launch with half the q heads took 14.5 us for ~7.3 us of bytes)
CONFIGS += [(sp, bk, 8, st) for sp, bk, st in itertools.product((4, 8, 16), (128, 256), (2, 4, 5))]


def main(argv=None) -> None:
    ap = common.parser(__doc__)
    args = ap.parse_args(argv)
    dev, dtype = common.setup(args)
    from wide.kernels import decode_qkv as reference_op
    from wide.kernels.triton.decode_qkv import decode_qkv as host

    rows, md = [], ["| shape | q heads run | default | fastest (split, block_k, warps[, stages]) | cuBLAS, same bytes |",
                    "|---|---|---|---|---|"]
    for name, (K, HQ, HK, D, biased) in SHAPES.items():
        gen = torch.Generator(device="cpu").manual_seed(0)

        def rnd(*shape, scale=1.0):
            return (torch.randn(*shape, generator=gen) * scale).to(dev, dtype)

        x = rnd(1, 1, K)
        ws = [(rnd(HQ * D, K, scale=K ** -0.5), rnd(HK * D, K, scale=K ** -0.5), rnd(HK * D, K, scale=K ** -0.5))
              for _ in range(COPIES)]
        bs = (rnd(HQ * D), rnd(HK * D), rnd(HK * D)) if biased else (None, None, None)
        cat = [torch.cat(w) for w in ws]
        cos, sin = rnd(1, 1, D), rnd(1, 1, D)
        S = 4096 + 64
        kc, vc = torch.zeros(1, HK, S, D, device=dev, dtype=dtype), torch.zeros(1, HK, S, D, device=dev, dtype=dtype)
        nbytes = sum(t.numel() for t in ws[0]) * dtype.itemsize
        dense_us = graph_ms([lambda w=w: F.linear(x, w) for w in cat]) * 1e3
        print(f"\n{name}: q / k / v {nbytes / 2**20:.1f} MiB; cuBLAS GEMV over the same bytes {dense_us:.1f} us "
              f"({nbytes / dense_us / 1e6:.2f} TB/s)", flush=True)
        half = (torch.rand(1, 1, HQ // (HQ // HK), generator=gen) < 0.5).to(dev)
        for label, mask in (("every q head", None), ("50% of the q groups", half)):
            results = []
            for cfg in CONFIGS:
                def setup(cfg=cfg, mask=mask):
                    pos = torch.tensor(7, device=dev)
                    out = host(x, *ws[0], mask, *bs, cos, sin, kc, vc, pos, config=cfg)
                    pos0 = torch.tensor(7, device=dev)
                    ref = reference_op(x.float(), *(w.float() for w in ws[0]), mask,
                                       q_bias=None if bs[0] is None else bs[0].float(),
                                       k_bias=None if bs[1] is None else bs[1].float(),
                                       v_bias=None if bs[2] is None else bs[2].float(), cos=cos.float(),
                                       sin=sin.float(), k_cache=kc.float().clone(), v_cache=vc.float().clone(),
                                       position=pos0, backend="torch")
                    calls = [lambda w=w: host(x, *w, mask, *bs, cos, sin, kc, vc, pos, config=cfg) for w in ws]
                    return out, ref, lambda: graph_ms(calls) * 1e3
                time_candidate(results, cfg, setup)
            print(f"  {label}  (split, block_k, warps[, stages]): us, TB/s of the q / k / v bytes, rel. error of q")
            print_fastest(results, lambda t, c, e: f"    {c:>16}  {t:7.1f} us  {nbytes / t / 1e6:5.2f} TB/s  {e}")
            rows += [dict(shape=name, mask=label, config=c, us=t, error=e, dense_us=dense_us) for t, c, e in results]
            best, default = min(results), next(r for r in results if r[1] == "None")
            md.append(f"| {name} | {label} | {default[0]:.1f} us | {best[1]}: {best[0]:.1f} us "
                      f"({nbytes / best[0] / 1e6:.2f} TB/s) | {dense_us:.1f} us |")
        # `KernelOptions.decode_qkv_split`'s two launches at their default configs: k / v (beside the router), then
        # the masked q heads
        pos = torch.tensor(7, device=dev)
        kv = [lambda w=w: host(x, *w, None, *bs, cos, sin, kc, vc, pos, part="kv") for w in ws]
        pair = [lambda w=w: (host(x, *w, None, *bs, cos, sin, kc, vc, pos, part="kv"),
                             host(x, *w, half, *bs, cos, sin, kc, vc, pos, part="q")) for w in ws]
        kv_us, pair_us = graph_ms(kv) * 1e3, graph_ms(pair) * 1e3
        print(f"  two launches (decode_qkv_split): k / v alone {kv_us:.1f} us, then 50% of the q heads: "
              f"{pair_us:.1f} us in all", flush=True)
        rows.append(dict(shape=name, mask="kv, then 50% of the q groups", config="split", us=pair_us, kv_us=kv_us,
                         dense_us=dense_us))
        md.append(f"| {name} | k / v, then 50% of the q groups (two launches) | {pair_us:.1f} us (k / v {kv_us:.1f}) "
                  f"| – | {dense_us:.1f} us |")
    common.report(args, {"rows": rows}, "\n".join(md))


if __name__ == "__main__":
    main()
