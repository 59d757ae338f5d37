"""How much of a reduction-side GEMM (`o_proj`, `down_proj`) trained routers let a prefill skip.

A routed `gemm_k` tile of ``t`` tokens must read group ``g``'s weights when *any* of its tokens runs ``g``. With
independent random masks at density ``d`` that is ``1 - (1 - d)^t`` of the (tile, group) pairs — all of them for
``t = 64`` — which is why the 8B-shape prefill rows in BENCHMARKS.md run those projections dense. Trained routers
may agree across neighbouring or similar tokens; this script measures, on held-out prose, the share of
(tile, group) pairs a tile-skipping kernel would still compute, per router kind, for tile sizes ``--tiles``:

- ``natural``: tokens in sequence order;
- ``pca`` / ``lex``: tokens reordered once per layer and kind (one permutation for all groups: what a
  reduction-side kernel could gather and scatter back), by their mask's projection on its first principal
  component, or lexicographically by their mask bits, most balanced groups first (``lex`` is the order
  ``gemm_k``'s sorted tiles use: ``wide.kernels.plan.pattern_order``);
- ``random``: independent masks with each group's measured density (the synthetic benchmark's case).

After the table: how many (layer, window) masks would take ``gemm_k``'s sorted tiles at prefill (``lex`` share at
most ``K_SORTED_MAX_SHARE`` at the kernel's 128-token tiles) instead of the dense path.

It also prints the realized sparsity on those tokens, kinds averaged and by routed weight.

The ideal is the density itself (only the pairs some token runs). 1 / share bounds the speed-up of that GEMM.

    PYTHONPATH=. python3 benchmarks/mask_structure.py --checkpoint runs/smollm2-135m/calibrate/routers.safetensors
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def tile_share(mask: torch.Tensor, tile: int) -> float:
    """Share of (tile, group) pairs with at least one running token; ``mask`` ``[T, G]`` bool."""
    T, G = mask.shape
    n = T // tile
    return mask[: n * tile].view(n, tile, G).any(1).float().mean().item()


def pca_order(mask: torch.Tensor) -> torch.Tensor:
    x = mask.float()
    x = x - x.mean(0)
    if float(x.abs().sum()) == 0.0:
        return torch.arange(mask.shape[0])
    _, _, v = torch.linalg.svd(x, full_matrices=False)
    return torch.argsort(x @ v[0])


def lex_order(mask: torch.Tensor) -> torch.Tensor:
    from wide.kernels.plan import pattern_order

    return pattern_order(mask)


def trained_parser(doc: str) -> argparse.ArgumentParser:
    """The options of the CPU experiments over a model with trained routers (this script, prefill_coherence.py)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--checkpoint", required=True, help="trained routers (.safetensors)")
    ap.add_argument("--tokens", type=int, default=1024, help="tokens per window")
    ap.add_argument("--windows", type=int, default=4)
    return ap


def load_trained_model(args):
    """(tokenizer, model with ``args.checkpoint``'s routers, eval mode) for ``trained_parser``'s options."""
    import wide
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from wide.assets import resolve_model
    from wide.io.checkpoint import load_trained, read_metadata

    path = resolve_model(args.model)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    wide.apply_wide(model, read_metadata(args.checkpoint)["wide_config"])
    load_trained(model, args.checkpoint)
    return tok, model.eval()


def main() -> None:
    import wide
    from wide.data import default_corpus_split

    ap = trained_parser(__doc__)
    ap.add_argument("--tiles", type=int, nargs="+", default=[16, 64, 128])
    args = ap.parse_args()
    tok, model = load_trained_model(args)
    runtime = wide.modeling.runtime_of(model)

    windows, stream = [], []  # held-out documents back to back (separated by EOS), cut into windows
    for doc in default_corpus_split()[1]:
        stream += tok(doc, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        while len(stream) >= args.tokens and len(windows) < args.windows:
            windows.append(stream[: args.tokens])
            stream = stream[args.tokens:]
        if len(windows) == args.windows:
            break
    if len(windows) < args.windows:
        raise SystemExit(f"--windows: the held-out corpus has only {len(windows)} windows of {args.tokens} tokens")

    from wide.kernels.triton.gemm_k import K_SORTED_MAX_SHARE, K_SORTED_MIN_M

    gen = torch.Generator().manual_seed(0)
    rows: dict[tuple, list[float]] = {}
    qualify: dict[str, list[int]] = {}
    rates: dict[str, list[float]] = {}
    with torch.no_grad():
        for w in windows:
            model(input_ids=torch.tensor([w]))
            stats = wide.sparsity_stats(model)
            rates.setdefault("kinds averaged (the training target's measure)", []).append(float(stats.realized()))
            rates.setdefault("by routed weight", []).append(float(stats.realized_by_weight()))
            for wl in runtime.layers:
                for kind, m in wl.group_mask.items():
                    m = (m if m.dtype == torch.bool else m > 0.5)[0]  # [T, G]
                    if m.shape[-1] < 2:
                        continue
                    dens = m.float().mean(0)
                    rand = torch.rand(m.shape, generator=gen) < dens
                    orders = {"pca": pca_order(m), "lex": lex_order(m)}
                    rows.setdefault((kind, "density"), []).append(m.float().mean().item())
                    for t in args.tiles:
                        rows.setdefault((kind, f"natural t={t}"), []).append(tile_share(m, t))
                        for name, order in orders.items():
                            rows.setdefault((kind, f"{name} t={t}"), []).append(tile_share(m[order], t))
                        rows.setdefault((kind, f"random t={t}"), []).append(tile_share(rand, t))
                    q = qualify.setdefault(kind, [0, 0])
                    q[0] += tile_share(m[orders["lex"]], 128) <= K_SORTED_MAX_SHARE
                    q[1] += 1
    print(f"{args.model}, routers {args.checkpoint}, {args.windows} windows x {args.tokens} tokens of held-out "
          f"prose; mean over layers (min-max)")
    print("| kind | measure | share of (tile, group) pairs computed |")
    print("|---|---|---|")
    for (kind, what), vals in rows.items():
        print(f"| {kind} | {what} | {statistics.mean(vals):.3f} ({min(vals):.3f}-{max(vals):.3f}) |")
    for what, vals in rates.items():
        print(f"realized sparsity, {what}: {statistics.mean(vals):.3f}")
    for kind, (n, total) in qualify.items():
        print(f"{kind}: {n} of {total} (layer, window) masks would run gemm_k on sorted tiles (share at 128-token "
              f"tiles <= {K_SORTED_MAX_SHARE}, in prompts of >= {K_SORTED_MIN_M} tokens); the rest dense")


if __name__ == "__main__":
    main()
