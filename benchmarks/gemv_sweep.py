"""Decode-step configs of the routed GEMMs (batch 1: GEMV; batch 16: skinny GEMM) on Llama-3.1-8B layer
shapes, against cuBLAS.

Each timed call reads a different one of 8 weight copies, as a model's layers do: the H200's 50 MB L2 would
otherwise hold a 50%-routed o_proj (17 MB) across back-to-back calls and flatter it (`kernel_table.py` reuses one
weight). CUDA graph of 3 x 8 calls, median of 30 replays; densities 0.5 (half the groups, random) and 1.0;
("list" configs are timed with the plan's group list already built, i.e. without its launch; "local" builds
each tile's list inside the GEMM); with ``--m 16`` the 50% masks are both batch-coherent (every row the same
groups, as coherent decode makes them) and per-token (independent rows). Prints the six fastest configs per case, plus the default (``None``).

    PYTHONPATH=. python3 benchmarks/gemv_sweep.py            # batch 1 (H200: ~1 min)
    PYTHONPATH=. python3 benchmarks/gemv_sweep.py --m 16     # batch 16
    PYTHONPATH=. python3 benchmarks/gemv_sweep.py --colmajor [--m 16]   # gemm_k over column-major weights
"""
import dataclasses
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import common  # noqa: E402
from benchmarks.common import graph_ms, print_fastest, time_candidate  # noqa: E402
from wide.kernels import get_backend, make_plan  # noqa: E402
from wide.kernels.triton.common import GemmConfig as C  # noqa: E402

DT, DEV, COPIES = torch.bfloat16, "cuda", 8
SHAPES = {  # name: (op, N, K, group) of one Llama-3.1-8B layer (attention groups: 4 heads of 128)
    "o_proj": ("gemm_k", 4096, 4096, 512), "down": ("gemm_k", 4096, 14336, 128),
    "q_proj": ("gemm_mn", 4096, 4096, 512), "gate_up": ("swiglu", 14336, 4096, 128)}
K_CANDIDATES = [C(1, bn, 128, w, st, split_k=sp, variant=v) for v in ("local", "list", "")
                for (bn, w, st, sp) in ((32, 4, 4, 4), (32, 4, 4, 2), (32, 4, 4, 8), (16, 4, 4, 4), (64, 4, 4, 8),
                                        (32, 8, 4, 4), (32, 2, 4, 4), (32, 4, 6, 4), (16, 2, 4, 8), (64, 8, 3, 4),
                                        # more programs in flight (2026-12-03: o_proj / down at ~2 / ~3 TB/s)
                                        (32, 8, 4, 8), (64, 8, 4, 8), (16, 8, 4, 8), (32, 8, 4, 16), (64, 8, 4, 16),
                                        (128, 8, 3, 8),
                                        # no split-K (2026-12-04): narrow N tiles, no workspace, no arrival atomic
                                        # and no last-program sum (o_proj at 50% reads one 512 group per split)
                                        (8, 4, 4, 1), (8, 8, 4, 1), (16, 4, 4, 1), (16, 8, 4, 1), (32, 8, 4, 1),
                                        (8, 4, 6, 1), (16, 4, 4, 2))]
MN_CANDIDATES = [("direct", C(1, bn, bk, w, st)) for (bn, bk, w, st) in
                 ((8, 512, 4, 4), (16, 256, 4, 4), (16, 512, 4, 4), (32, 256, 4, 4), (8, 256, 4, 4), (8, 512, 8, 4),
                  (4, 512, 4, 4), (8, 1024, 4, 3), (16, 512, 8, 3), (8, 512, 2, 6))]
# column-major gemm_k weights (`--colmajor`, wide.set_weight_layout): wide N tiles (rows contiguous along N), short K
# chunks, more splits over the active groups' chunks
K_COL = [C(1, bn, bk, w, st, split_k=sp, variant=v) for v in ("local", "")
         for (bn, bk, w, st, sp) in ((256, 32, 8, 4, 8), (256, 32, 8, 4, 4), (256, 32, 4, 4, 8), (128, 32, 4, 4, 8),
                                     (128, 64, 8, 4, 8), (128, 32, 4, 4, 16), (256, 16, 8, 4, 8), (512, 16, 8, 4, 4),
                                     (512, 32, 8, 3, 4), (256, 64, 8, 3, 4), (128, 16, 4, 4, 16), (64, 64, 4, 4, 16),
                                     (256, 32, 8, 4, 16), (512, 16, 8, 4, 8), (1024, 8, 8, 4, 4),
                                     # long contiguous runs of each weight row (2-4 KB), more splits over K
                                     (1024, 8, 8, 4, 16), (1024, 8, 8, 4, 32), (1024, 16, 8, 3, 16),
                                     (512, 16, 8, 4, 16), (512, 8, 8, 4, 32), (2048, 4, 8, 4, 32), (2048, 8, 8, 3, 16))]
K16_COL = [C(16, bn, bk, w, st, split_k=sp, variant=v, swap=sw) for v in ("list", "") for sw in (False, True)
           for (bn, bk, w, st, sp) in ((128, 32, 4, 4, 4), (128, 64, 4, 4, 4), (256, 32, 8, 4, 4), (64, 64, 4, 4, 8),
                                       (128, 32, 4, 4, 8), (256, 64, 8, 3, 4), (64, 128, 4, 4, 4))]
CANDIDATES = {"gemm_k": [None] + K_CANDIDATES, "gemm_mn": [None] + MN_CANDIDATES, "swiglu": [None] + MN_CANDIDATES}
K16 = [C(16, bn, bk, w, st, split_k=sp, variant=v) for v in ("", "list", "local")
       for (bn, bk, w, st, sp) in ((64, 128, 4, 4, 4), (64, 128, 4, 4, 2), (64, 128, 4, 4, 8), (32, 128, 4, 4, 4),
                                   (128, 128, 4, 4, 4), (64, 128, 8, 4, 4), (32, 128, 4, 4, 8), (64, 64, 4, 6, 4))]
MN16 = [("direct", C(16, bn, bk, w, st)) for (bn, bk, w, st) in
        ((64, 128, 4, 4), (32, 128, 4, 4), (128, 128, 4, 4), (64, 256, 4, 3), (32, 256, 4, 4), (16, 256, 4, 4),
         (64, 64, 4, 6), (128, 64, 8, 4), (32, 128, 2, 4), (16, 512, 4, 3), (64, 128, 8, 4))]
# the transposed tile (weights on the MMA's M side: block_n >= 64 takes Hopper's wgmma)
K16 += [C(16, bn, bk, w, st, split_k=sp, variant=v, swap=True) for v in ("list", "")
        for (bn, bk, w, st, sp) in ((64, 128, 4, 4, 4), (64, 128, 4, 5, 4), (64, 128, 4, 6, 4), (64, 128, 4, 5, 2),
                                    (64, 128, 4, 6, 3), (64, 64, 4, 8, 4), (64, 64, 4, 6, 4), (128, 128, 4, 5, 4),
                                    (128, 128, 4, 4, 2), (128, 64, 4, 6, 4), (64, 128, 8, 5, 4), (64, 256, 4, 3, 4))]
MN16 += [("direct", C(16, bn, bk, w, st, split_k=sp, swap=True)) for (bn, bk, w, st, sp) in
         ((64, 128, 4, 4, 1), (64, 128, 4, 5, 1), (64, 128, 4, 6, 1), (64, 128, 4, 4, 2), (64, 128, 4, 5, 4),
          (64, 128, 4, 4, 4), (64, 256, 4, 4, 4), (64, 64, 4, 8, 4), (64, 64, 4, 6, 1), (128, 128, 4, 4, 1),
          (128, 64, 4, 6, 1), (128, 128, 4, 4, 2), (64, 128, 8, 5, 4), (64, 128, 4, 5, 3), (64, 64, 4, 8, 2))]
CANDIDATES_16 = {"gemm_k": [None] + K16, "gemm_mn": [None] + MN16, "swiglu": [None] + MN16}


def graph_us(fns, reps: int = 30) -> float:
    """Median us per call of ``fns`` (3 rounds of all of them in one CUDA graph)."""
    return graph_ms(list(fns) * 3, reps=reps) * 1e3


def routed_calls(op, x, ws, w2s, mask, plan, cfg):
    """(one call per weight copy, the first copy's output, the torch reference of it)."""
    tb, ref = get_backend("triton"), get_backend("torch")
    if op == "swiglu":
        fns = [lambda w=w, w2=w2: tb.swiglu(x, w, w2, mask, plan=plan, config=cfg) for w, w2 in zip(ws, w2s)]
        return fns, fns[0](), ref.swiglu(x, ws[0], w2s[0], mask)
    fn = getattr(tb, op)
    fns = [lambda w=w: fn(x, w, mask, plan=plan, config=cfg) for w in ws]
    return fns, fns[0](), getattr(ref, op)(x, ws[0], mask)


def masks(m: int, ng: int):
    """(label, density, [m, ng] bool mask) cases: half the groups at random (batch-coherent and per-token rows
    when m > 1), and all of them."""
    def half():
        row = torch.zeros(ng, dtype=torch.bool, device=DEV)
        row[torch.randperm(ng, device=DEV)[: ng // 2]] = True
        return row
    out = [("coherent" if m > 1 else "", 0.5, half().expand(m, ng).contiguous())]
    if m > 1:
        out.append(("per-token", 0.5, torch.stack([half() for _ in range(m)])))
    out.append(("", 1.0, torch.ones(m, ng, dtype=torch.bool, device=DEV)))
    return out


def main(argv=None) -> None:
    ap = common.parser(__doc__, device=None, dtype=None, outputs=False)
    ap.add_argument("--m", type=int, default=1, choices=[1, 16], help="rows (decode batch)")
    ap.add_argument("--colmajor", action="store_true",
                    help="gemm_k weights stored column-major (wide.set_weight_layout), with its candidate configs; "
                         "the dense baseline stays cuBLAS on the row-major weights")
    ap.add_argument("--best-json", default=None,
                    help="with --colmajor: write each gemm_k shape's fastest config at 50%% (coherent at --m 16) as "
                         "gemm_k.COLMAJOR_DECODE entries (merged into the file), for benchmarks/with_configs.py")
    ap.add_argument("--half-only", action="store_true", help="only the 50%% masks (a short session)")
    ap.add_argument("--swap-only", action="store_true",
                    help="with --m 16: only the default and the transposed-tile (swap) configs")
    args = ap.parse_args(argv)
    common.setup(args)
    m = args.m
    candidates = CANDIDATES if m == 1 else CANDIDATES_16
    if args.swap_only:
        candidates = {op: [c for c in cs if c is None or (c[1] if isinstance(c, tuple) else c).swap]
                      for op, cs in candidates.items()}
    if args.colmajor:
        candidates = {"gemm_k": [None] + (K_COL if m == 1 else K16_COL)}
    best: dict = {}
    print(common.meta_line(common.meta()))
    print(f"bf16, M={m}, {COPIES} weight copies" + (", gemm_k weights column-major" if args.colmajor else ""))
    for name, (op, N, K, group) in SHAPES.items():
        if op not in candidates:
            continue
        x = torch.randn(m, K, device=DEV, dtype=DT)
        ws = [torch.randn(N, K, device=DEV, dtype=DT) / K ** 0.5 for _ in range(COPIES)]
        w2s = [torch.randn(N, K, device=DEV, dtype=DT) / K ** 0.5 for _ in range(COPIES)] if op == "swiglu" else None
        nbytes = N * K * 2 * (2 if op == "swiglu" else 1)
        extra = ""
        if op == "swiglu":
            dense = [lambda w=w, w2=w2: F.silu(F.linear(x, w)) * F.linear(x, w2) for w, w2 in zip(ws, w2s)]
            cat = [torch.cat([w, w2]) for w, w2 in zip(ws, w2s)]
            extra = f", one cuBLAS GEMV over [gate; up] {graph_us([lambda w=w: F.linear(x, w) for w in cat]):.1f} us"
            del cat
        else:
            dense = [lambda w=w: F.linear(x, w) for w in ws]
        d = graph_us(dense)
        print(f"== {name} {op} N={N} K={K} group={group}: dense {d:.1f} us ({nbytes / d / 1e6:.2f} TB/s){extra}",
              flush=True)
        rows_ws = ws
        if args.colmajor:  # the same values stored column-major (strides (1, N)); cuBLAS on them too
            ws = [w.t().contiguous().t() for w in ws]
            extra = f", cuBLAS on the column-major copies {graph_us([lambda w=w: F.linear(x, w) for w in ws]):.1f} us"
            print(f"   {name}{extra}", flush=True)
        ng = (K if op == "gemm_k" else N) // group
        for label, density, mask in masks(m, ng):
            if args.half_only and density != 0.5:
                continue
            plan = make_plan(mask).materialize(flat=True)
            res = []
            if args.colmajor:  # the row-major weights' default config, in the same run
                fns, _, _ = routed_calls(op, x, rows_ws, w2s, mask, plan, None)
                t = graph_us(fns)
                print(f"  d={density:.2f} {label:9s} {t:7.1f} us  {d / t:5.2f}x  "
                      f"{nbytes * density / t / 1e6:5.2f} TB/s  row-major weights, default config", flush=True)
            for cfg in candidates[op]:
                def setup(cfg=cfg):
                    fns, out, ref = routed_calls(op, x, ws, w2s, mask, plan, cfg)
                    return out, ref, lambda: graph_us(fns)
                time_candidate(res, cfg, setup)
            if args.best_json and args.colmajor and density == 0.5 and label in ("", "coherent"):
                best[f"{m},{group >= 512}"] = _fastest_right(res, candidates[op])
            print_fastest(res, lambda t, c, err: f"  d={density:.2f} {label:9s} {t:7.1f} us  {d / t:5.2f}x  "
                                                 f"{nbytes * density / t / 1e6:5.2f} TB/s  rel err {err}  {c}")
    if args.best_json and args.colmajor:
        write_best(args.best_json, best)


def _fastest_right(res: list, cands: list):
    """The fastest candidate's config fields among those whose result matched the reference (``None``: the default
    won)."""
    def right(err: str) -> bool:
        try:
            return float(err) < 2e-2
        except ValueError:
            return False
    t, label, _ = min(r for r in res if right(r[2]))
    return None if label == "None" else next(dataclasses.asdict(c) for c in cands if str(c) == label)


def write_best(path: str, best: dict) -> None:
    """Merges ``best`` (``"<rows>,<wide>"`` -> config fields; ``None``: the default won, no entry) into ``path``."""
    p = Path(path)
    merged = json.loads(p.read_text()) if p.is_file() else {}
    merged.update({k: v for k, v in best.items() if v is not None})
    p.write_text(json.dumps(merged, indent=1))
    print(f"best column-major configs -> {path}: {merged}")


if __name__ == "__main__":
    main()
