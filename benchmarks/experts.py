"""The routed FFN with wide groups run as experts (`wide.kernels.ffn_experts`) vs dense cuBLAS and the per-tile
path, Llama-3.1-8B FFN shape (K = N = 4096, F = 14336), bf16, random per-token masks.

    PYTHONPATH=. python3 benchmarks/experts.py --json results/experts.json
    PYTHONPATH=. python3 benchmarks/experts.py --m 4096 --width 1024 --density 0.5
    PYTHONPATH=. python3 benchmarks/experts.py --smoke        # CPU dry run (Triton interpreter, tiny shapes)

Rows per (M, group width, density): the whole FFN (dense = cuBLAS gate, up, SiLU * up, down; ``tiles`` = the
per-tile swiglu + gemm_k kernels; ``experts`` = row gather, grouped gate/up, grouped SwiGLU, grouped down,
combine; ``auto`` = the op's own choice from a plan with the router's density hint, and from a plan without
one, whose density the op reads: an all-true mask then runs plain cuBLAS), then the parts: down alone
(dense cuBLAS on ``[M, F]`` vs the grouped down GEMM on the grouped ``h`` plus the combine, and the combine
alone) and gate/up alone (dense vs gather + grouped GEMMs + SwiGLU); then `gemm_k` alone (``--gemm-k``: an 8B
``o_proj`` over KV-head units, a ``down_proj``) dense vs per tile vs as experts (`KernelOptions.gemm_k_experts`).

``tiles`` and ``experts`` run on a plan whose products are cached (the kernels alone); ``w/ plan`` and
``w/ layout`` are what a layer pays per call: a fresh plan (a layer builds one per forward) and the op, so the
per-tile path builds its partition and the expert path its layout (`build_layout`, one launch from the mask; it
needs no partition). ``layout`` times that build alone, ``partition`` the plan's partition alone. Density 1.0 is
the 0%-sparsity row: the op must not be slower than dense there. Times: medians of ``triton.testing.do_bench``
(L2 flushed).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

SMOKE = "--smoke" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import common  # noqa: E402

from wide.kernels import experts, ffn_experts, get_backend, kernel_options, make_plan  # noqa: E402
from wide.kernels.experts import ffn_dense  # noqa: E402

if SMOKE:
    K, F, N, DT, DEV = 64, 512, 48, torch.float32, "cpu"
else:
    K, F, N, DT, DEV = 4096, 14336, 4096, torch.bfloat16, "cuda"


def timed(fn) -> float:
    """Median ms of ``fn``."""
    if SMOKE:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median"))


def rel_err(out, ref) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-12)).item()


def ffn_rows(M: int, width: int, density: float, seed: int = 0) -> list[dict]:
    """The expert-path rows of one (M, group width, density): whole FFN, down alone, gate/up alone."""
    from wide.kernels.triton import experts as host

    G = F // width
    gen = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(M, K, device=DEV, dtype=DT, generator=gen)
    gate, up = (torch.randn(F, K, device=DEV, dtype=DT, generator=gen) * K ** -0.5 for _ in range(2))
    down = torch.randn(N, F, device=DEV, dtype=DT, generator=gen) * F ** -0.5
    mask = torch.rand(M, G, device=DEV, generator=gen) < density
    triton_be = get_backend("triton")

    def plan():  # the router's rate as the hint: what a routed layer's plan carries
        return make_plan(mask, density_hint=density).materialize(flat=True)

    ref = get_backend("torch").ffn_experts(x, gate, up, down, mask)
    p_tiles, p_exp, p_auto = plan(), plan(), plan()
    p_measured = make_plan(mask).materialize(flat=True)  # no hint: the op reads the density (all-true: cuBLAS)
    run = {
        "dense": lambda: ffn_dense(x, gate, up, down),
        "tiles": lambda: triton_be.ffn_experts(x, gate, up, down, mask, plan=p_tiles, path="tiles"),
        "experts": lambda: triton_be.ffn_experts(x, gate, up, down, mask, plan=p_exp, path="experts"),
        "auto": lambda: ffn_experts(x, gate, up, down, mask, plan=p_auto),
        "auto_measured": lambda: ffn_experts(x, gate, up, down, mask, plan=p_measured),
        # per call, as a layer pays it: a fresh (hinted) plan, so the path's own plan products are built too
        "tiles_call": lambda: triton_be.ffn_experts(x, gate, up, down, mask, plan=make_plan(mask, density_hint=density),
                                                    path="tiles"),
        "experts_call": lambda: triton_be.ffn_experts(x, gate, up, down, mask,
                                                      plan=make_plan(mask, density_hint=density), path="experts"),
    }
    ms = {name: timed(fn) for name, fn in run.items()}
    err = {name: rel_err(fn(), ref) for name, fn in run.items() if name != "dense"}
    on = kernel_options().ffn_experts  # the label names the path the op took (the switch included)
    chosen = experts.ffn_path(M, width, p_auto, eager=True, enabled=on)
    chosen_measured = experts.ffn_path(M, width, p_measured, eager=True, enabled=on)
    plan_ms = timed(lambda: make_plan(mask, density_hint=density).token_order(True))
    layout_ms = timed(lambda: host.layout_for(make_plan(mask, density_hint=density), read_counts=False))
    base = dict(M=M, width=width, groups=G, density=density)
    rows = [dict(base, part="ffn", dense_ms=ms["dense"], tiles_ms=ms["tiles"], experts_ms=ms["experts"],
                 auto_ms=ms["auto"], auto_path=chosen, auto_measured_ms=ms["auto_measured"],
                 auto_measured_path=chosen_measured, plan_ms=plan_ms, layout_ms=layout_ms,
                 tiles_call_ms=ms["tiles_call"], experts_call_ms=ms["experts_call"],
                 dense_over_tiles=ms["dense"] / ms["tiles"], dense_over_experts=ms["dense"] / ms["experts"],
                 dense_over_tiles_with_plan=ms["dense"] / ms["tiles_call"],
                 dense_over_experts_with_layout=ms["dense"] / ms["experts_call"],
                 dense_over_auto=ms["dense"] / ms["auto"], err=err),
            # the plan products built alone: the per-tile path's partition, the expert path's layout
            dict(base, part="layout", plan_ms=plan_ms, layout_ms=layout_ms)]

    # the parts, on the grouped layout of this mask
    lay = host.layout_for(p_exp, read_counts=False)
    gmm = "grouped" if experts.grouped_mm_runs(x, K, width, N)[0] else None
    if gmm is None and not SMOKE:
        print(f"[parts skipped: {experts.grouped_mm_runs(x, K, width, N)[1]}]", file=sys.stderr)
        return rows
    gv = gate.view(G, width, K).transpose(1, 2)
    uv = up.view(G, width, K).transpose(1, 2)
    dv = down.view(N, G, width).permute(1, 2, 0)

    def gate_up():
        xg = host.gather_rows(x, lay)
        return host.swiglu_rows(torch._grouped_mm(xg, gv, offs=lay.ends), torch._grouped_mm(xg, uv, offs=lay.ends),
                                lay)

    h_grouped = gate_up()
    h_dense = ffn_dense_h(x, gate, up)
    partial = torch._grouped_mm(h_grouped, dv, offs=lay.ends)
    out = torch.empty(M, N, device=DEV, dtype=DT)
    parts = {
        "down_dense": lambda: torch.mm(h_dense, down.t()),
        "down_experts": lambda: host.combine(torch._grouped_mm(h_grouped, dv, offs=lay.ends), lay.slot, out),
        "combine": lambda: host.combine(partial, lay.slot, out),
        "gate_up_dense": lambda: ffn_dense_h(x, gate, up),
        "gate_up_experts": gate_up,
    }
    pm = {name: timed(fn) for name, fn in parts.items()}
    rows.append(dict(base, part="down", dense_ms=pm["down_dense"], experts_ms=pm["down_experts"],
                     combine_ms=pm["combine"], dense_over_experts=pm["down_dense"] / pm["down_experts"]))
    rows.append(dict(base, part="gate_up", dense_ms=pm["gate_up_dense"], experts_ms=pm["gate_up_experts"],
                     dense_over_experts=pm["gate_up_dense"] / pm["gate_up_experts"]))
    return rows


def gemm_k_rows(M: int, Kr: int, width: int, density: float, seed: int = 0) -> list[dict]:
    """`gemm_k` alone as experts (`KernelOptions.gemm_k_experts`: ``o_proj`` over whole KV-head units at
    ``Kr = 4096``; a ``down_proj`` at ``Kr = 14336``) vs dense cuBLAS and the per-tile path, per call (a fresh
    hinted plan each call: the per-tile path's products or the expert path's layout are built too)."""
    from wide.kernels.triton import experts as host
    from wide.kernels.triton import gemm_k as k_host
    from wide.kernels.options import KernelOptions

    G = Kr // width
    gen = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(M, Kr, device=DEV, dtype=DT, generator=gen)
    w = torch.randn(N, Kr, device=DEV, dtype=DT, generator=gen) * Kr ** -0.5
    mask = torch.rand(M, G, device=DEV, generator=gen) < density
    ref = get_backend("torch").gemm_k(x.float(), w.float(), mask)
    tiles_opt = KernelOptions(gemm_k_experts=False)

    def plan():
        return make_plan(mask, density_hint=density)

    run = {
        "dense": lambda: x @ w.t(),
        "tiles": lambda: k_host.gemm_k(x, w, mask, None, plan(), None, False, None, tiles_opt),
        "experts": lambda: host.gemm_k_experts(x, w, mask, None, plan(), None),
    }
    ms = {name: timed(fn) for name, fn in run.items()}
    err = {name: rel_err(fn(), ref) for name, fn in run.items() if name != "dense"}
    lay = host.layout_for(plan(), read_counts=False)
    gmm = "grouped" if experts.grouped_mm_runs(x, width, N)[0] else "loop"
    if gmm == "loop":
        lay = host.layout_for(plan(), read_counts=True)
    partial = experts.reduce_gemm(x, w, lay, gmm, x.dtype, gather_cols=host.gather_cols)
    out = torch.empty(M, N, device=DEV, dtype=DT)
    combine_ms = timed(lambda: host.combine(partial, lay.slot, out))
    return [dict(M=M, width=width, groups=G, density=density, part="gemm_k", K=Kr, dense_ms=ms["dense"],
                 tiles_ms=ms["tiles"], experts_ms=ms["experts"], combine_ms=combine_ms,
                 dense_over_tiles=ms["dense"] / ms["tiles"], dense_over_experts=ms["dense"] / ms["experts"],
                 err=err)]


def ffn_dense_h(x, gate, up):
    """Dense ``silu(x gate^T) * (x up^T)`` (cuBLAS, torch's SiLU and mul)."""
    return torch.nn.functional.silu(x @ gate.t()).mul_(x @ up.t())


def fmt(r: dict) -> str:
    head = f"| {r['part']:7} | {r['M']:5} | {r['width']:4} x {r['groups']:2} | {1 - r['density']:4.0%} "
    if r["part"] == "ffn":
        return (head + f"| {r['dense_ms']:7.3f} | {r['tiles_ms']:7.3f} ({r['dense_over_tiles']:.2f}x; w/ plan "
                f"{r['tiles_call_ms']:.3f} = {r['dense_over_tiles_with_plan']:.2f}x) "
                f"| {r['experts_ms']:7.3f} ({r['dense_over_experts']:.2f}x; w/ layout {r['experts_call_ms']:.3f} = "
                f"{r['dense_over_experts_with_layout']:.2f}x) "
                f"| {r['auto_path']} {r['auto_ms']:.3f} ({r['dense_over_auto']:.2f}x); "
                f"no hint: {r['auto_measured_path']} {r['auto_measured_ms']:.3f} "
                f"({r['dense_ms'] / r['auto_measured_ms']:.2f}x) "
                f"| max err {max(r['err'].values()):.1e} |")
    if r["part"] == "gemm_k":
        return (head + f"| {r['dense_ms']:7.3f} | {r['tiles_ms']:7.3f} ({r['dense_over_tiles']:.2f}x, K={r['K']}) "
                f"| {r['experts_ms']:7.3f} ({r['dense_over_experts']:.2f}x, combine {r['combine_ms']:.3f}) | "
                f"| max err {max(r['err'].values()):.1e} |")
    if r["part"] == "layout":
        return head + f"| | partition {r['plan_ms']:.3f} | layout {r['layout_ms']:.3f} | | |"
    extra = f", combine {r['combine_ms']:.3f}" if "combine_ms" in r else ""
    return head + f"| {r['dense_ms']:7.3f} | | {r['experts_ms']:7.3f} ({r['dense_over_experts']:.2f}x{extra}) | | |"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", type=int, nargs="+", default=[8, 40] if SMOKE else [4096, 16384])
    ap.add_argument("--width", type=int, nargs="+", default=[64, 128] if SMOKE else [512, 1024, 2048])
    ap.add_argument("--density", type=float, nargs="+", default=[0.5, 1.0],
                    help="executed share of (token, group) pairs (1.0: the 0%%-sparsity row)")
    ap.add_argument("--gemm-k", nargs="*", default=["64:16", "64:32"] if SMOKE else
                    ["4096:512", "4096:1024", "14336:512", "14336:1024"], metavar="K:WIDTH",
                    help="gemm_k-alone rows (K = 4096: an 8B o_proj over KV-head units of 512 channels; 14336: a "
                         "down_proj); none: skip them")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--smoke", action="store_true", help="CPU dry run (Triton interpreter, tiny shapes)")
    args = ap.parse_args(argv)
    for w in args.width:
        if F % w or w % 16:
            raise SystemExit(f"--width: {w} must divide the FFN width {F} and be a multiple of 16")
    for d in args.density:
        if not 0 < d <= 1:
            raise SystemExit(f"--density: {d} must be in (0, 1]")
    if not SMOKE and not torch.cuda.is_available():
        raise SystemExit("needs CUDA (or --smoke)")
    shapes = []
    for spec in args.gemm_k:
        try:
            kr, w = (int(v) for v in spec.split(":"))
        except ValueError:
            raise SystemExit(f"--gemm-k: {spec!r} is not K:WIDTH") from None
        if kr % w or w % 16:
            raise SystemExit(f"--gemm-k: width {w} must divide K {kr} and be a multiple of 16")
        shapes.append((kr, w))
    if SMOKE:  # tiny shapes: let the auto path take the experts too
        experts.EXPERT_MIN_GROUP, experts.EXPERT_MIN_M = 16, 1
    print("| part | M | width x G | sparsity | dense ms | tiles ms (dense/tiles; per call w/ plan) | "
          "experts ms (dense/experts; per call w/ layout) | auto | |")
    print("|---|---|---|---|---|---|---|---|---|")
    rows = []
    with torch.inference_mode():
        for M in args.m:
            for w in args.width:
                for d in args.density:
                    for r in ffn_rows(M, w, d):
                        rows.append(r)
                        print(fmt(r), flush=True)
                    if DEV == "cuda":
                        torch.cuda.empty_cache()
            for kr, w in shapes:
                for d in args.density:
                    for r in gemm_k_rows(M, kr, w, d):
                        rows.append(r)
                        print(fmt(r), flush=True)
                    if DEV == "cuda":
                        torch.cuda.empty_cache()
    dev = torch.cuda.get_device_name() if DEV == "cuda" else "cpu"
    print(f"\n{dev}, torch {torch.__version__}")
    if args.json:
        common.write_json(args.json, {"device": dev, "shape": dict(K=K, F=F, N=N), "rows": rows},
                          common.meta(DEV))


if __name__ == "__main__":
    main()
