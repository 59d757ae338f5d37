"""What would tile-coherent prefill routing cost in quality? (an experiment, not a feature)

With per-token masks, a 128-token tile of ``o_proj`` / ``down_proj`` needs nearly every group, so those GEMMs run
dense at prefill (BENCHMARKS.md, mask structure). If instead every tile of ``--tile`` consecutive tokens ran one
shared set of groups — the ones with the highest tile-mean execute probability, as many as the tile's tokens run
on average under their own decisions, times ``keep_scale`` (batch-coherent decode's rule, applied along the
sequence) — every routed GEMM could skip whole (tile, group) blocks. This script measures the perplexity of
trained routers under that rule against per-token routing, on held-out windows of the default corpus, and the
density each kind then runs (for o_proj / down_proj the per-token work is the tile share, ~0.95 for the FFN).

    PYTHONPATH=. python3 benchmarks/prefill_coherence.py --checkpoint runs/smollm2-135m/calibrate/routers.safetensors
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def tile_coherent(margin: torch.Tensor, fallback: torch.Tensor, tile: int, keep_scale: float) -> torch.Tensor:
    """``margin [B, T, G]`` -> bool mask constant over each tile of ``tile`` tokens (a ragged tail keeps
    ``fallback``, the per-token decisions)."""
    B, T, G = margin.shape
    n = T // tile
    m = margin[:, : n * tile].float().view(B, n, tile, G)
    score = torch.sigmoid(m).mean(2)  # [B, n, G]
    mean_count = (m >= 0).float().sum(-1).mean(-1)  # [B, n]
    keep = torch.clamp(torch.floor(mean_count * keep_scale + 0.5), 1, G).long()
    rank = torch.argsort(torch.argsort(-score, dim=-1, stable=True), dim=-1)
    out = (rank < keep[..., None])[:, :, None, :].expand(B, n, tile, G).reshape(B, n * tile, G)
    return torch.cat([out, fallback[:, n * tile:].bool()], 1) if n * tile < T else out


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from mask_structure import load_trained_model, trained_parser  # benchmarks/mask_structure.py

    from wide.data import default_corpus_split
    from wide.eval.perplexity import perplexity
    from wide.modeling.layer import WideLayer

    ap = trained_parser(__doc__)
    ap.add_argument("--cells", nargs="+", default=["128:1", "128:1.25", "128:1.5", "64:1", "64:1.25"],
                    help="tile:keep_scale pairs (per-token routing is always the first row)")
    args = ap.parse_args()
    tok, model = load_trained_model(args)

    mode: dict = {"tile": None, "scale": 1.0}
    decide = WideLayer._decide

    def routed(self, kind, residual):  # the masks the layer records (and the meter reads) are these
        mask = decide(self, kind, residual)
        if mode["tile"] is not None and residual.shape[1] > 1 and kind in self.routers:
            margin = self.routers[kind].execute_decision(residual, margin=True)
            mask = tile_coherent(margin, mask, mode["tile"], mode["scale"])
        return mask

    WideLayer._decide = routed
    docs = default_corpus_split()[1]
    print(f"{args.model}, routers {args.checkpoint}, the held-out split of the default corpus in "
          f"{args.windows} windows of {args.tokens} tokens (wide.eval.perplexity)\n")
    print("| routing | ppl | attn density | FFN density |\n|---|---|---|---|")
    try:
        for cell in [None] + args.cells:
            tile, scale = (None, 1.0) if cell is None else (int(cell.split(":")[0]), float(cell.split(":")[1]))
            mode.update(tile=tile, scale=scale)
            with torch.inference_mode():
                res = perplexity(model, tok, docs, window=args.tokens, max_tokens=args.tokens * args.windows,
                                 batch_size=1)
            kinds = res["sparsity"]["by_kind"]
            name = "per-token" if tile is None else f"tile {tile}, keep x{scale:g}"
            print(f"| {name} | {res['ppl']:.2f} | {1 - kinds.get('attn', float('nan')):.3f} | "
                  f"{1 - kinds.get('ffn', float('nan')):.3f} |", flush=True)
    finally:
        WideLayer._decide = decide


if __name__ == "__main__":
    main()
