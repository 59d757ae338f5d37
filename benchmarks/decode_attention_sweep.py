"""Decode attention configs (`wide.kernels.attention_decode`, triton) against cuDNN / flash sdpa, on the
decode rows of `wide bench`: Llama-3.1-8B heads (32 q / 8 kv, head_dim 128), a static cache of 4104 slots
with 4097 valid keys per row, batch 1 and 16.

Masks per batch: half the head groups at random, the same for every row (batch-coherent) and independent per
row (per-token), and all groups. The dense baselines read exactly the valid keys (sliced, no mask), as the
bench's dense side does. CUDA graph of 20 calls, median of 30 replays (`kernel_table.py`'s graph timer). Prints
the six fastest configs per case and the default (``None``), each with its error against masked sdpa; candidate
``splits`` 0 / -2 / 2 mean decode_splits' count, half and twice it.

    PYTHONPATH=. python3 benchmarks/decode_attention_sweep.py        # H200: ~1-2 min
"""
import dataclasses
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import common  # noqa: E402
from benchmarks.common import graph_ms as bench_graph, print_fastest, time_candidate  # noqa: E402
from wide.kernels import get_backend  # noqa: E402
from wide.kernels.triton.attention import AttentionConfig as A  # noqa: E402

DT, DEV = torch.bfloat16, "cuda"
HQ, HK, D, SLOTS, VALID = 32, 8, 128, 4104, 4097
GSIZE = HQ // HK  # one routing group per kv head (the bench's default)
CANDIDATES = [None] + [A(block_n=bn, num_warps=w, num_stages=st, splits=sp)
                       for bn, w, st in ((64, 4, 2), (64, 4, 3), (128, 4, 2), (128, 4, 3), (128, 8, 3), (32, 4, 3),
                                         (64, 8, 3), (32, 2, 4), (256, 8, 2))
                       for sp in (0, -2, 2)]  # 0: decode_splits' count; -2 / 2: half / twice it
QUICK = [None] + [A(block_n=bn, num_warps=w, num_stages=st, splits=sp)
                  for bn, w, st, sp in ((64, 4, 3, 0), (64, 4, 2, 0), (64, 8, 3, 0), (64, 4, 3, -2), (32, 4, 3, -2),
                                        (128, 4, 2, -2), (64, 8, 2, -2), (64, 8, 3, -3))]

# the splits combined in the split kernel's last program (fold) against the second launch, at fewer splits
FOLD = [None] + [A(block_n=64, num_warps=w, num_stages=st, splits=sp, fold=f)
                 for w, st, sp in ((8, 3, -2), (8, 3, -3), (8, 3, -4), (4, 2, -2), (4, 3, -3), (8, 4, -4))
                 for f in (False, True)]


def main(argv=None) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from wide.kernels.triton.attention import decode_splits

    ap = common.parser(__doc__, device=None, dtype=None, outputs=False)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--quick", action="store_true", help="a few candidates (~9) instead of 28")
    ap.add_argument("--fold", action="store_true", help="the folded combine against the second launch (13)")
    args = ap.parse_args(argv)
    common.setup(args)
    print(common.meta_line(common.meta()))
    print(f"bf16, {HQ} q / {HK} kv heads, D={D}, {VALID} of {SLOTS} cache slots valid")
    candidates = FOLD if args.fold else QUICK if args.quick else CANDIDATES
    tb = get_backend("triton")
    for B in args.batch:
        q = torch.randn(B, 1, HQ, D, device=DEV, dtype=DT)
        k = torch.randn(B, SLOTS, HK, D, device=DEV, dtype=DT)
        v = torch.randn(B, SLOTS, HK, D, device=DEV, dtype=DT)
        lengths = torch.full((B,), VALID, device=DEV, dtype=torch.int32)
        qh, kh, vh = q.transpose(1, 2), k[:, :VALID].transpose(1, 2), v[:, :VALID].transpose(1, 2)
        dense = {}
        for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
            def fn(backend=backend):
                with sdpa_kernel([backend]):
                    return F.scaled_dot_product_attention(qh, kh, vh, enable_gqa=True)
            try:
                dense[name] = bench_graph(fn) * 1e3
            except Exception as e:  # noqa: BLE001 - a backend that does not take this shape
                print(f"  sdpa {name}: {type(e).__name__}")
        ref_all = F.scaled_dot_product_attention(qh, kh, vh, enable_gqa=True).transpose(1, 2)
        best_dense = min(dense.values())
        nbytes = 2 * B * VALID * HK * D * 2
        auto = decode_splits(B, HK, SLOTS, 64, torch.device(DEV))
        print(f"== batch {B}: sdpa " + ", ".join(f"{n} {t:.1f} us" for n, t in dense.items())
              + f" ({nbytes / best_dense / 1e6:.2f} TB/s); default splits {auto}", flush=True)
        g = torch.Generator(device=DEV).manual_seed(B)
        half = torch.zeros(HK, dtype=torch.bool, device=DEV)
        half[torch.randperm(HK, device=DEV, generator=g)[: HK // 2]] = True
        per_token = torch.stack([torch.randperm(HK, device=DEV, generator=g) < HK // 2 for _ in range(B)])
        cases = [("coherent 50%", half.expand(B, HK).contiguous()), ("all on", torch.ones(B, HK, dtype=torch.bool,
                                                                                         device=DEV))]
        if B > 1:
            cases.insert(1, ("per-token 50%", per_token))
        for label, mask in cases:
            mask3 = mask.view(B, 1, HK)
            ref = ref_all * mask3.repeat_interleave(GSIZE, -1)[..., None]
            density = mask.float().mean().item()
            res = []
            for cfg in candidates:
                if cfg is not None and cfg.splits:
                    splits = max(1, auto * cfg.splits if cfg.splits > 0 else auto // -cfg.splits)
                    cfg = dataclasses.replace(cfg, splits=splits)

                def setup(cfg=cfg, ref=ref, mask3=mask3):
                    def fn():
                        return tb.attention_decode(q, k, v, mask3, lengths=lengths, config=cfg)
                    return fn(), ref, lambda: bench_graph(fn) * 1e3
                time_candidate(res, cfg, setup)
            print_fastest(res, lambda t, c, err: f"  {label:14s} {t:7.1f} us  {best_dense / t:5.2f}x  "
                                                 f"{nbytes * density / t / 1e6:5.2f} TB/s  rel err {err}  {c}")


if __name__ == "__main__":
    main()
