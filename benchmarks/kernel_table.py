"""Routed kernels vs dense baselines on Llama-3.1-8B shapes (hidden 4096, FFN 14336, 32 q / 8 kv heads,
head_dim 128), bf16, random masks. Prints dense/routed ratios with absolute times.

    PYTHONPATH=. python3 benchmarks/kernel_table.py            # full table (H200: ~4 min)
    PYTHONPATH=. python3 benchmarks/kernel_table.py --quick    # the target rows only
    PYTHONPATH=. python3 benchmarks/kernel_table.py --json results.json
    PYTHONPATH=. python3 benchmarks/kernel_table.py --tune     # time candidate configs per shape
    PYTHONPATH=. python3 benchmarks/kernel_table.py --ops router_margin,coherent_select   # some ops only
    PYTHONPATH=. python3 benchmarks/kernel_table.py --quick --kernel-option skinny_swap=0  # an A/B of a default config
    python benchmarks/kernel_table.py --smoke --ops gemm_mn                   # CPU dry run (Triton interpreter)

Timing: medians of CUDA-event timings. Large ops: ``triton.testing.do_bench`` (L2 flushed between
runs). Small ops (M <= 128, decode): one CUDA graph holding 20 back-to-back calls, replayed; the same
for the dense side. ``gather`` synchronizes with the host, so it is timed eagerly. The routing plan is
built once outside the timed region (a layer builds it once and its paired ops share it); its cost is
reported in its own column.

Routing rows (`router_margin`, `coherent_select`, decode sizes; `router_margin` also at a 4k prefill's
rows): the "dense" side is the torch reference (the eager ops a decode step would launch: RMS norm, two
GEMVs, a comparison; or sigmoid, mean, lerp, sort, scatter), the routed side the one-launch Triton kernel,
both in CUDA graphs;
"rel err" is the fraction of decisions that differ. `coherent_route` rows compare the one launch with the
two Triton launches it replaces (`router_margin` margins, then `coherent_select`).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
SMOKE = "--smoke" in sys.argv  # CPU dry run of this script through the Triton interpreter, tiny shapes
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks import common  # noqa: E402
from benchmarks.common import rel_err  # noqa: E402

try:
    import wide.kernels  # noqa: F401
except Exception as exc:  # the top-level package pulls in modeling code; the kernels stand alone
    print(f"[import wide failed ({type(exc).__name__}: {exc}); loading wide.kernels alone]", file=sys.stderr)
    for name in [m for m in sys.modules if m == "wide" or m.startswith("wide.")]:
        del sys.modules[name]
    _pkg = types.ModuleType("wide")
    _pkg.__path__ = [os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "wide")]
    sys.modules["wide"] = _pkg
    import wide.kernels  # noqa: F401

from wide.kernels import get_backend, make_plan  # noqa: E402

if SMOKE:
    HIDDEN, FFN, HQ, HK, HEAD_D = 64, 256, 8, 2, 16
    DT = torch.float16
    DEV = "cpu"
else:
    HIDDEN, FFN, HQ, HK, HEAD_D = 4096, 14336, 32, 8, 128
    DT = torch.bfloat16
    DEV = "cuda"

# (dense / routed) targets at 50% random masks; None = no target
TARGETS = {
    ("gemm_mn", 1): 1.8, ("gemm_mn", 16): 1.0, ("gemm_mn", 128): 1.0, ("gemm_mn", 4096): 1.85,
    ("gemm_mn", 16384): 1.85, ("gemm_k", 1): 1.8, ("gemm_k", 16): 1.0, ("gemm_k", 128): 1.0,
    ("gemm_k", 4096): 1.85, ("gemm_k", 16384): 1.85, ("prefill", 4096): 1.6, ("prefill", 16384): 1.85,
    ("decode", 32768): 1.8,
}
TARGETS.update({("swiglu", m): t for (op, m), t in list(TARGETS.items()) if op == "gemm_mn"})


# --------------------------------------------------------------------------------------------------
# timing
# --------------------------------------------------------------------------------------------------


def bench_eager(fn, rep_ms: float = 200.0) -> float:
    if SMOKE:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    return common.bench_ms(fn, rep_ms)


def bench_graph(fn, inner: int = 20, reps: int = 30) -> float:
    """Median ms per call of ``fn`` replayed from a CUDA graph of ``inner`` back-to-back calls."""
    return bench_eager(fn) if SMOKE else common.graph_ms(fn, inner=inner, reps=reps)


def bench(fn, small: bool) -> float:
    return bench_graph(fn) if small else bench_eager(fn)


def rand_mask(shape, density: float, seed: int) -> torch.Tensor:
    gen = torch.Generator(device=DEV).manual_seed(seed)
    return torch.rand(shape, generator=gen, device=DEV) < density


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def empty_cache():
    if DEV == "cuda":
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------------------------------
# dense baselines
# --------------------------------------------------------------------------------------------------


def dense_swiglu_fns(x, wg, wu, wgu):
    def two():
        return F.silu(F.linear(x, wg)) * F.linear(x, wu)

    def fused():
        a, b = F.linear(x, wgu).chunk(2, dim=-1)
        return F.silu(a) * b

    return {"2xlinear": two, "gate_up": fused}


def sdpa_fn(q, k, v, causal, backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    be = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
          "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[backend]
    if SMOKE:
        be = SDPBackend.MATH

    def run():
        with sdpa_kernel([be]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)

    return run


_DENSE_CACHE: dict = {}


def best_dense(fns: dict, small: bool, key=None) -> tuple[str, float, dict]:
    """Fastest of the dense candidates (the strongest baseline); cached per shape ``key``."""
    if key is not None and key in _DENSE_CACHE:
        return _DENSE_CACHE[key]
    times = {}
    for name, fn in fns.items():
        try:
            fn()
            sync()
            times[name] = bench(fn, small)
        except Exception as e:  # a backend that does not support the shape
            times[name] = float("nan")
            print(f"  [dense {name} failed: {type(e).__name__}: {str(e)[:120]}]", file=sys.stderr)
    ok = {k: t for k, t in times.items() if not math.isnan(t)}
    name = min(ok, key=ok.get)
    if key is not None:
        _DENSE_CACHE[key] = (name, ok[name], times)
    return name, ok[name], times


# --------------------------------------------------------------------------------------------------
# rows
# --------------------------------------------------------------------------------------------------


def small_size(n: int, cap: int) -> int:
    """Sizes shrink to the interpreter's reach in --smoke runs."""
    return min(n, cap) if SMOKE else n


def row(op, size, density, dense_name, dense_ms, routed_ms, gather_ms, plan_ms, err, extra=None, group=None):
    r = dict(op=op, size=size, group=group, sparsity=round(1 - density, 3), dense=dense_name,
             dense_ms=dense_ms, routed_ms=routed_ms, gather_ms=gather_ms, plan_ms=plan_ms,
             ratio=dense_ms / routed_ms if routed_ms else float("nan"),
             vs_gather=(gather_ms / routed_ms) if (gather_ms and routed_ms) else None, err=err)
    t = TARGETS.get((op, size)) if density == 0.5 and group in (128, 4, None) else None
    if density == 1.0:
        t = 0.95
    r["target"] = t
    r["met"] = None if t is None else bool(r["ratio"] >= t)
    if extra:
        r.update(extra)
    return r


def time_plan(mask, flat):
    """What the default kernels need from a fresh plan: the per-group token order."""
    def build():
        return make_plan(mask).token_order(flat)

    return bench_eager(build, rep_ms=50)


def run_gemm(op: str, M: int, group: int, density: float, with_gather: bool, config=None,
             x_masked: bool = False, patterns: int | None = None) -> dict:
    """One gemm row; ``x_masked`` times gemm_k on an input that is already zero in masked groups (the
    down projection after SwiGLU), with the op told so. ``patterns``: structured masks, every token a copy
    of one of that many random rows (what trained routers would need to give for the reduction-side GEMMs
    to skip work at prefill: gemm_k then takes the pattern-sorted tiles when they need few enough groups)."""
    M = small_size(M, 40)
    small = M <= 128
    if op == "gemm_k":
        K, N = FFN, HIDDEN
    else:
        K, N = HIDDEN, FFN
    x = torch.randn(M, K, device=DEV, dtype=DT)
    w = torch.randn(N, K, device=DEV, dtype=DT) / math.sqrt(K)
    mask = rand_mask((M, (N if op != "gemm_k" else K) // group), density, seed=M + group)
    if patterns:
        pick = torch.randint(0, patterns, (M,), generator=torch.Generator().manual_seed(M)).to(DEV)
        mask = rand_mask((patterns, mask.shape[1]), density, seed=M + group + 1)[pick]
    plan = make_plan(mask).materialize(flat=True)
    tb, gb, rb = get_backend("triton"), get_backend("gather"), get_backend("torch")
    extra = {}
    if op == "gemm_mn":
        dense_name, dense_ms, _ = best_dense({"F.linear": lambda: F.linear(x, w)}, small, ("mn", M))
        routed = lambda: tb.gemm_mn(x, w, mask, plan=plan, config=config)  # noqa: E731
        gathered = lambda: gb.gemm_mn(x, w, mask, plan=plan)  # noqa: E731
        ref = rb.gemm_mn(x, w, mask)
    elif op == "swiglu":
        w2 = torch.randn(N, K, device=DEV, dtype=DT) / math.sqrt(K)
        wgu = torch.cat([w, w2])
        dense_name, dense_ms, all_dense = best_dense(dense_swiglu_fns(x, w, w2, wgu), small, ("swiglu", M))
        extra["dense_all_ms"] = all_dense
        routed = lambda: tb.swiglu(x, w, w2, mask, plan=plan, config=config)  # noqa: E731
        gathered = lambda: gb.swiglu(x, w, w2, mask, plan=plan)  # noqa: E731
        ref = rb.swiglu(x, w, w2, mask)
    else:
        if x_masked:
            x = x * mask.repeat_interleave(group, -1).to(x.dtype)
            extra["x_masked"] = True
        if patterns:
            from wide.kernels.triton.gemm_k import sorted_k_config

            extra["patterns"] = patterns
            extra["sorted_tile_share"] = round(plan.tile_share(sorted_k_config(M, N, K, group).block_m), 3)
        dense_name, dense_ms, _ = best_dense({"F.linear": lambda: F.linear(x, w)}, small, ("k", M))
        routed = lambda: tb.gemm_k(x, w, mask, plan=plan, config=config, x_masked=x_masked)  # noqa: E731
        gathered = lambda: gb.gemm_k(x, w, mask, plan=plan)  # noqa: E731
        ref = rb.gemm_k(x, w, mask)
    out = routed()
    err = rel_err(out, ref)
    del ref, out
    routed_ms = bench(routed, small)
    gather_ms = bench_eager(gathered, rep_ms=100) if with_gather else None
    from wide.kernels.triton.gemm_mn import DIRECT_MAX_M

    needs_plan = op != "gemm_k" and M > DIRECT_MAX_M  # direct and gemm_k kernels read the mask itself
    plan_ms = time_plan(mask, True) if needs_plan else 0.0
    if patterns:  # the sorted tiles' plan (one argsort, a gather, a partition) is built per layer
        from wide.kernels.triton.gemm_k import sorted_k_config

        bm = sorted_k_config(M, N, K, group).block_m
        plan_ms = bench_eager(lambda: make_plan(mask).tile_order(bm), rep_ms=50)
    name = op + ("(x_masked)" if x_masked else "") + (f"(sorted, {patterns} patterns)" if patterns else "")
    return row(name, M, density, dense_name, dense_ms, routed_ms, gather_ms, plan_ms, err, extra, group)


def run_prefill(T: int, gsize: int, density: float, with_gather: bool, config=None, B: int = 1) -> dict:
    T = small_size(T, 48)
    q = torch.randn(B, T, HQ, HEAD_D, device=DEV, dtype=DT)
    k = torch.randn(B, HK, T, HEAD_D, device=DEV, dtype=DT)  # HF cache layout [B, Hk, S, D]
    v = torch.randn(B, HK, T, HEAD_D, device=DEV, dtype=DT)
    qh = q.transpose(1, 2).contiguous()  # SDPA's preferred layout, prepared outside the timing
    mask = rand_mask((B, T, HQ // gsize), density, seed=T + gsize)
    plan = make_plan(mask).materialize(flat=False)
    tb, gb = get_backend("triton"), get_backend("gather")
    dense_name, dense_ms, all_dense = best_dense(
        {"sdpa-flash": sdpa_fn(qh, k, v, True, "flash")}, small=False, key=("prefill", T, B))
    extra = {}
    if ("cudnn", T, B) not in _DENSE_CACHE:
        try:
            fn = sdpa_fn(qh, k, v, True, "cudnn")
            fn()
            _DENSE_CACHE[("cudnn", T, B)] = bench_eager(fn)
        except Exception:
            _DENSE_CACHE[("cudnn", T, B)] = None
    extra["cudnn_ms"] = _DENSE_CACHE[("cudnn", T, B)]
    kt, vt = k.transpose(1, 2), v.transpose(1, 2)
    routed = lambda: tb.attention_prefill(q, kt, vt, mask, plan=plan, config=config)  # noqa: E731
    out = routed()
    ref = sdpa_fn(qh, k, v, True, "flash")().transpose(1, 2)
    ref = ref * mask.repeat_interleave(gsize, -1)[..., None]
    err = rel_err(out, ref)
    del out, ref
    routed_ms = bench_eager(routed)
    gather_ms = None
    if with_gather:
        gathered = lambda: gb.attention_prefill(q, kt, vt, mask, plan=plan)  # noqa: E731
        gather_ms = bench_eager(gathered, rep_ms=100)
    plan_ms = time_plan(mask, False)
    return row("prefill", T, density, dense_name, dense_ms, routed_ms, gather_ms, plan_ms, err, extra, gsize)


def run_decode(S: int, B: int, density: float, with_gather: bool, config=None) -> dict:
    S = small_size(S, 40)
    B = small_size(B, 3)
    gsize = HQ // HK
    q = torch.randn(B, 1, HQ, HEAD_D, device=DEV, dtype=DT)
    k = torch.randn(B, HK, S, HEAD_D, device=DEV, dtype=DT)
    v = torch.randn(B, HK, S, HEAD_D, device=DEV, dtype=DT)
    qh = q.transpose(1, 2).contiguous()
    mask = rand_mask((B, 1, HQ // gsize), density, seed=S + B)
    tb, gb = get_backend("triton"), get_backend("gather")
    dense_name, dense_ms, all_dense = best_dense(
        {"sdpa-flash": sdpa_fn(qh, k, v, False, "flash"), "sdpa-efficient": sdpa_fn(qh, k, v, False, "efficient"),
         "sdpa-cudnn": sdpa_fn(qh, k, v, False, "cudnn")}, small=True, key=("decode", S, B))
    kt, vt = k.transpose(1, 2), v.transpose(1, 2)
    routed = lambda: tb.attention_decode(q, kt, vt, mask, config=config)  # noqa: E731
    out = routed()
    ref = sdpa_fn(qh, k, v, False, "flash")().transpose(1, 2) * mask.repeat_interleave(gsize, -1)[..., None]
    err = rel_err(out, ref)
    routed_ms = bench_graph(routed)
    gather_ms = None
    if with_gather:
        gather_ms = bench_eager(lambda: gb.attention_decode(q, kt, vt, mask), rep_ms=100)
    extra = {"batch": B, "dense_all_ms": all_dense}
    r = row("decode", S, density, dense_name, dense_ms, routed_ms, gather_ms, 0.0, err, extra, gsize)
    return r


def run_routing(op: str, B: int, G: int) -> dict:
    """A low-rank router's decisions (rank 32) or one coherent-decode selection (keep G/2), B tokens."""
    import wide.kernels as wk

    B, G = small_size(B, 3), small_size(G, 20)
    rank = 32
    if op == "router_margin":
        x = torch.randn(B, HIDDEN, device=DEV, dtype=DT)
        down = torch.randn(rank, HIDDEN, device=DEV) / HIDDEN**0.5
        up, bias = torch.randn(G, rank, device=DEV) / rank**0.5, torch.zeros(G, device=DEV)
        ref = lambda: wk.router_margin(x, down, up, bias, backend="torch")  # noqa: E731
        fused = lambda: wk.router_margin(x, down, up, bias, backend="triton")  # noqa: E731
    elif op == "coherent_route":  # the fused step against the two triton launches it replaces
        x = torch.randn(B, 1, HIDDEN, device=DEV, dtype=DT)
        down = torch.randn(rank, HIDDEN, device=DEV) / HIDDEN**0.5
        up, bias = torch.randn(G, rank, device=DEV) / rank**0.5, torch.zeros(G, device=DEV)
        states = [(torch.zeros(G, device=DEV), torch.zeros(G, dtype=torch.bool, device=DEV),
                   torch.zeros((), dtype=torch.int64, device=DEV)) for _ in range(2)]

        def ref():
            m = wk.router_margin(x, down, up, bias, decide=False, backend="triton").view(B, G)
            return wk.coherent_select(m, *states[0], keep=None, backend="triton")

        fused = lambda: wk.coherent_route(x, down, up, bias, ema=states[1][0], selection=states[1][1],  # noqa: E731
                                          step=states[1][2], keep=None, backend="triton")
        err = (ref() != fused()).float().mean().item()
        return row(op, B, 0.5, "router_margin + coherent_select", bench_graph(ref), bench_graph(fused), None, 0.0,
                   err, group=G)
    else:
        m = torch.randn(B, G, device=DEV, dtype=DT)
        states = [(torch.zeros(G, device=DEV), torch.zeros(G, dtype=torch.bool, device=DEV),
                   torch.zeros((), dtype=torch.int64, device=DEV)) for _ in range(2)]
        ref = lambda: wk.coherent_select(m, *states[0], keep=G // 2, backend="torch")  # noqa: E731
        fused = lambda: wk.coherent_select(m, *states[1], keep=G // 2, backend="triton")  # noqa: E731
    err = (ref() != fused()).float().mean().item()
    return row(op, B, 0.5, "torch ops", bench_graph(ref), bench_graph(fused), None, 0.0, err, group=G)


# --------------------------------------------------------------------------------------------------
# tables
# --------------------------------------------------------------------------------------------------


def fmt_row(r: dict) -> str:
    size = f"{r['size']}" + (f" b{r['batch']}" if "batch" in r else "")
    vg = f"{r['vs_gather']:.2f}x" if r.get("vs_gather") else "-"
    tgt = f">={r['target']}" if r.get("target") else ""
    met = "" if r.get("met") is None else ("ok" if r["met"] else "MISS")
    return (f"| {r['op']} | {size} | {r['group']} | {r['sparsity']:.0%} | {r['dense']} {r['dense_ms']*1e3:.1f} | "
            f"{r['routed_ms']*1e3:.1f} | **{r['ratio']:.2f}x** | {vg} | {r['plan_ms']*1e3:.0f} | "
            f"{r['err']:.1e} | {tgt} {met} |")


HEADER = ("| op | M/T/S | group | sparsity | dense (us) | routed (us) | dense/routed | gather/routed | "
          "plan (us) | rel err | target |\n|---|---|---|---|---|---|---|---|---|---|---|")


def main_table(args) -> list[dict]:
    quick = args.quick
    rows: list[dict] = []
    sizes = [1, 16, 128, 4096, 16384] if quick else [1, 16, 128, 1024, 4096, 16384]
    jobs = []
    for op in ("gemm_mn", "swiglu", "gemm_k"):
        for M in sizes:
            jobs.append(("gemm", op, M, 128, 0.5))
        if not quick:
            for g in (64, 32):
                for M in (1, 128, 4096):
                    jobs.append(("gemm", op, M, g, 0.5))
    for M in (4096, 16384):
        jobs.append(("gemm_xm", "gemm_k", M, 128, 0.5))
    for M in (4096, 16384):  # structured masks: gemm_k on pattern-sorted tiles
        for d, pats in ((0.5, 4), (0.5, 16), (0.25, 4)):
            jobs.append(("gemm_sorted", "gemm_k_sorted", M, 128, d, pats))
    for T in ([4096, 16384] if quick else [1024, 4096, 16384]):
        jobs.append(("prefill", T, 4, 0.5))
        if not quick:
            jobs.append(("prefill", T, 2, 0.5))
    for S in (4096, 32768):
        for B in (1, 16):
            if quick and S == 4096:
                continue
            jobs.append(("decode", S, B, 0.5))
    for op in ("router_margin", "coherent_select", "coherent_route"):
        for B in (1, 16, 4096) if op == "router_margin" else (1, 16):  # 4096: a prefill's rows (row-tile kernel)
            for G in (8, 112):
                jobs.append(("routing", op, B, G))
    sweep = [1.0, 0.9, 0.7, 0.5, 0.3, 0.1] if quick else [1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1]
    if SMOKE:
        sweep = [1.0, 0.5]
        jobs = [j for i, j in enumerate(jobs) if i % 3 == 0]
    for d in sweep:
        for op in ("gemm_mn", "swiglu", "gemm_k"):
            if d != 0.5:
                jobs.append(("gemm", op, 4096, 128, d))
        if d != 0.5:
            jobs.append(("prefill", 4096, 4, d))
        if d in (1.0,):
            jobs.append(("decode", 32768, 1, d))
            jobs.append(("gemm", "gemm_mn", 1, 128, d))
            jobs.append(("gemm", "gemm_k", 1, 128, d))
    if args.ops:
        wanted = set(args.ops.split(","))
        jobs = [j for j in jobs if (j[1] if j[0] in ("gemm", "gemm_xm", "gemm_sorted", "routing") else j[0]) in wanted]
    print(HEADER, flush=True)
    for job in jobs:
        t0 = time.time()
        try:
            with_gather = not args.no_gather
            if job[0] == "gemm":
                _, op, M, g, d = job
                r = run_gemm(op, M, g, d, with_gather=with_gather and d == 0.5 and M <= 16384)
            elif job[0] == "gemm_sorted":
                _, _, M, g, d, pats = job
                r = run_gemm("gemm_k", M, g, d, with_gather=False, x_masked=True, patterns=pats)
            elif job[0] == "gemm_xm":
                _, op, M, g, d = job
                r = run_gemm(op, M, g, d, with_gather=False, x_masked=True)
            elif job[0] == "routing":
                _, op, B, G = job
                r = run_routing(op, B, G)
            elif job[0] == "prefill":
                _, T, g, d = job
                r = run_prefill(T, g, d, with_gather=with_gather and d == 0.5 and T <= 4096)
            else:
                _, S, B, d = job
                r = run_decode(S, B, d, with_gather=with_gather and d == 0.5)
        except Exception as e:
            print(f"| {job} | FAILED {type(e).__name__}: {str(e)[:200]} |", flush=True)
            empty_cache()
            continue
        r["wall_s"] = round(time.time() - t0, 1)
        rows.append(r)
        print(fmt_row(r), flush=True)
        empty_cache()
        if args.json:  # after every row: a run cut short keeps what it timed
            common.write_json(args.json, {"rows": rows}, meta())
    return rows


_OPTIONS: dict = {}  # the --kernel-option switches of this run (KernelOptions.changed())


def meta() -> dict:
    m = common.meta(DEV)
    if SMOKE:
        m["gpu"] = "cpu (smoke, Triton interpreter)"
    m["kernel_options"] = _OPTIONS
    return m


# --------------------------------------------------------------------------------------------------
# tuning: candidate configs per (op, size)
# --------------------------------------------------------------------------------------------------


def tune(args) -> list[dict]:
    from wide.kernels.triton.attention import AttentionConfig
    from wide.kernels.triton.common import GemmConfig as C

    # run 2 candidates (run 1's winners kept as the first entry of each list)
    mn_perm = [C(128, 128, 64, 8, 3), C(256, 128, 64, 8, 3), C(128, 128, 64, 8, 2), C(128, 128, 32, 8, 4)]
    sw_perm = [C(128, 128, 64, 8, 3), C(128, 128, 64, 8, 2), C(256, 64, 64, 8, 3), C(128, 128, 32, 8, 4)]
    direct16 = [C(16, 128, 128, 4, 4), C(16, 64, 128, 4, 5), C(16, 64, 256, 4, 3), C(16, 128, 64, 4, 6),
                C(16, 256, 64, 8, 4)]
    direct128 = [C(128, 64, 64, 4, 4), C(128, 128, 64, 8, 4), C(128, 64, 128, 8, 3), C(64, 64, 128, 4, 4)]
    perm128 = [C(64, 128, 64, 4, 4), C(64, 128, 64, 4, 5), C(64, 64, 128, 4, 4), C(64, 128, 128, 4, 3)]
    k1 = [C(1, 32, 128, 4, 4, split_k=2), C(1, 32, 128, 4, 4), C(1, 16, 128, 4, 4), C(1, 32, 128, 4, 4, split_k=4),
          C(1, 64, 128, 4, 4, split_k=4), C(1, 16, 128, 4, 4, split_k=2), C(1, 32, 128, 4, 6, split_k=2),
          C(1, 32, 128, 4, 4, split_k=2, variant="list")]
    k16 = [C(16, 64, 128, 4, 4, split_k=2), C(16, 64, 128, 4, 4), C(16, 32, 128, 4, 4), C(16, 64, 128, 4, 4, split_k=4),
           C(16, 128, 128, 4, 4, split_k=2), C(16, 64, 128, 4, 6, split_k=2), C(16, 64, 128, 4, 4, variant="premask")]
    k128 = [C(64, 128, 64, 4, 4, split_k=2), C(128, 64, 64, 8, 4), C(128, 128, 64, 8, 4), C(64, 64, 128, 4, 4),
            C(128, 64, 128, 8, 3, split_k=2), C(64, 128, 64, 4, 4, split_k=4), C(128, 128, 64, 8, 4, variant="premask")]
    kbig = [C(128, 128, 64, 8, 3, variant="premask"), C(128, 128, 64, 8, 3)]
    plan = [
        ("gemm_k", 1, k1),
        ("gemm_k", 16, k16),
        ("gemm_k", 128, k128),
        ("gemm_k", 4096, kbig),
        ("gemm_mn", 16, [("direct", c) for c in direct16]),
        ("gemm_mn", 128, [("direct", c) for c in direct128] + [("perm", c) for c in perm128]),
        ("swiglu", 128, [("direct", c) for c in direct128[:2]] + [("perm", c) for c in perm128]),
        ("gemm_mn", 4096, [("perm", c) for c in mn_perm]),
        ("swiglu", 4096, [("perm", c) for c in sw_perm]),
    ]
    A = AttentionConfig
    pre = [A(64, 64, 4, 3), A(128, 128, 8, 3), A(128, 128, 8, 2), A(64, 128, 4, 3)]
    dec = [A(block_n=64, num_warps=4, num_stages=3), A(block_n=64, num_warps=4, num_stages=3, splits=32),
           A(block_n=64, num_warps=4, num_stages=3, splits=64), A(block_n=32, num_warps=2, num_stages=4),
           A(block_n=64, num_warps=4, num_stages=2), A(block_n=128, num_warps=4, num_stages=2, splits=64),
           A(block_n=32, num_warps=4, num_stages=3, splits=128)]
    results = []

    def one(label, fn):
        t0 = time.time()
        try:
            r = fn()
            r["config"] = label
            results.append(r)
            print(f"  {label:70s} {r['routed_ms']*1e3:9.1f} us  ratio {r['ratio']:.2f}x err {r['err']:.1e} "
                  f"({time.time()-t0:.0f}s)", flush=True)
        except Exception as e:
            print(f"  {label:70s} FAILED {type(e).__name__}: {str(e)[:150]}", flush=True)
        empty_cache()
        if args.json:
            common.write_json(args.json, {"tune": results}, meta())

    deadline = time.time() + args.tune_budget_s
    for T in (4096, 16384):
        print(f"prefill T={T}", flush=True)
        for cand in (pre[:1] if SMOKE else pre[:1] if T == 4096 else pre):
            if time.time() > deadline:
                break
            one(f"prefill T={T} {cand}", lambda: run_prefill(T, 4, 0.5, False, config=cand))
    for S, B in ((32768, 1), (32768, 16)):
        print(f"decode S={S} B={B}", flush=True)
        for cand in (dec[:1] if SMOKE else dec[:1] if B == 16 else dec):
            if time.time() > deadline:
                break
            one(f"decode S={S} B={B} {cand}", lambda: run_decode(S, B, 0.5, False, config=cand))
    for op, M, cands in plan:
        print(f"{op} M={M}", flush=True)
        for cand in (cands[:1] if SMOKE else cands):
            if time.time() > deadline:
                break
            one(f"{op} M={M} {cand}", lambda: run_gemm(op, M, 128, 0.5, False, config=cand))
    print("defaults at 0% sparsity (dense paths) and the plan", flush=True)
    one("gemm_mn 4096 d=1 default", lambda: run_gemm("gemm_mn", 4096, 128, 1.0, False))
    one("swiglu 4096 d=1 default", lambda: run_gemm("swiglu", 4096, 128, 1.0, False))
    one("gemm_k 4096 d=1 default", lambda: run_gemm("gemm_k", 4096, 128, 1.0, False))
    one("gemm_k 1 d=1 default", lambda: run_gemm("gemm_k", 1, 128, 1.0, False))
    one("decode 32768 b1 d=1 default", lambda: run_decode(32768, 1, 1.0, False))
    return results


OPS = ("gemm_mn", "swiglu", "gemm_k", "gemm_k_sorted", "prefill", "decode", "router_margin", "coherent_select",
       "coherent_route")


def parser():
    ap = common.parser(__doc__, device=None, dtype=None, kernel_options=True)
    ap.add_argument("--quick", action="store_true", help="target rows only")
    ap.add_argument("--tune", action="store_true", help="time candidate kernel configs instead")
    ap.add_argument("--tune-budget-s", type=float, default=300.0)
    ap.add_argument("--no-gather", action="store_true", help="skip the gather baseline")
    ap.add_argument("--smoke", action="store_true", help="CPU dry run (Triton interpreter, tiny shapes)")
    ap.add_argument("--ops", help=f"comma-separated ops to time (default: all): {', '.join(OPS)}")
    return ap


def main(argv=None):
    from wide.kernels import use_kernel_options

    args = parser().parse_args(argv)
    bad = [o for o in (args.ops or "").split(",") if o and o not in OPS]
    if bad:
        sys.exit(f"kernel_table.py: --ops takes {', '.join(OPS)}; got {', '.join(bad)}")
    options = common.kernel_options_of(args)
    if not SMOKE and not torch.cuda.is_available():
        sys.exit("kernel_table.py: needs a CUDA GPU (or --smoke for a CPU dry run)")
    _OPTIONS.update(options.changed())
    torch.manual_seed(0)
    print(json.dumps(meta()), flush=True)
    with use_kernel_options(options):
        if args.tune:
            tune(args)
            return
        rows = main_table(args)
    if args.md:
        Path(args.md).write_text(common.meta_line(meta()) + "\n\n" + HEADER + "\n"
                                 + "\n".join(fmt_row(r) for r in rows) + "\n")


if __name__ == "__main__":
    main()
