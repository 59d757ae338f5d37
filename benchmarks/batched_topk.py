"""Batched training-free pruning (`router: batched_topk`): realized rate and decode quality against the batch size.

What the method claims, measured on teacher-forced decoding of held-out text (a ``--prefix``-token prompt, then
``--steps`` decode steps, each predicting the next true token) at decode batch 1 / 4 / 16:

* **rate**: the share of routed groups no row of a decode step runs (the weights the step need not read),
  kinds averaged and by routed weight. Batched top-k keeps it at its batch-1 rate at every batch size; a
  threshold calibrated on single sequences (batch 1, so that its rate there is the same) drifts once rows share
  one mask (``threshold (batch mean)``: the rows' mean importance against it) or each row keeps its own mask
  (``threshold (per token)``: the step reads the union); per-token top-k and per-token routing read the union too.
* **quality**: decode-time perplexity of the true continuation, and agreement of greedy continuations with the
  dense model's (share of the first ``--steps`` tokens equal, mean common-prefix length), against per-token
  routing and batch-coherent routing of the same routers (``--checkpoint``: trained routers, e.g. the README's
  stage 1; without it the training-free per-token ``topk`` router).

    python benchmarks/batched_topk.py --tiny                      # CPU smoke run on a random tiny Llama
    python benchmarks/batched_topk.py --model smollm2-135m --checkpoint runs/smollm2-135m/calibrate/routers.safetensors
"""

from __future__ import annotations

import copy
import functools
import math
import sys
import time
from pathlib import Path

import torch

import wide
from wide.bench.quality import decode_nll

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import common  # noqa: E402
from wide.routers import BatchedTopKRouter


class ThresholdRouter(BatchedTopKRouter):
    """The same importance as batched top-k, decided by a threshold ``tau`` calibrated at batch 1 instead of by
    rank: ``per_token`` each row runs its groups above ``tau``, else every row runs the groups whose batch-mean
    importance is above it. Without ``tau`` it runs batched top-k and records decode-step importance (calibration)."""

    def __init__(self, spec, **kw):
        super().__init__(spec, period=1, memory=0.0, **kw)
        self.tau: float | None = None
        self.per_token = False
        self.seen: list[torch.Tensor] = []

    def top(self, score):
        return super().top(score) if self.tau is None else score >= self.tau

    def forward(self, hidden):
        if self.tau is None and hidden.shape[1] == 1:
            self.seen.append(self.importance(hidden).reshape(-1, self.num_groups).cpu())
        if self.tau is not None and self.per_token:
            keep = self.importance(hidden) >= self.tau
            sign = keep.float() * 2 - 1
            return torch.stack([sign, -sign], dim=-1) * self.margin
        return super().forward(hidden)


def routers(model, cls=None):
    out = [r for wl in wide.modeling.runtime_of(model).layers for r in wl.routers.values()]
    return [r for r in out if cls is None or isinstance(r, cls)]


def step_rates(model) -> tuple[float, float, float]:
    """Of the last forward's last position: share of groups no row runs (kinds averaged, by routed weight), and
    the share a row skips on average."""
    kinds, num, den, row = {}, 0.0, 0.0, []
    for wl in wide.modeling.runtime_of(model).layers:
        for sub, mask in wl.group_mask.items():
            m = mask.reshape(mask.shape[0], -1, mask.shape[-1])[:, -1] > 0.5  # [B, G]
            skip = 1.0 - m.any(0).float().mean().item()
            kinds.setdefault(sub, []).append(skip)
            num += skip * wl.routed_weights[sub]
            den += wl.routed_weights[sub]
            row.append(1.0 - m.float().mean().item())
    mean = sum(sum(v) / len(v) for v in kinds.values()) / max(1, len(kinds))
    return mean, num / max(den, 1.0), sum(row) / max(1, len(row))


def _usage_nll(model, data, batch, prefix):
    """`teacher_forced`, reading the rates after every decode step (decode_nll calls back through ``usage``)."""
    rates, nll = [], 0.0

    class Probe(list):
        def append(self, _):
            rates.append(step_rates(model))

    for i in range(0, len(data), batch):
        nll += decode_nll(model, data[i:i + batch], prefix, Probe())
    n = math.ceil(len(data) / batch)
    return nll / n, [sum(r[j] for r in rates) / max(1, len(rates)) for j in range(3)]


def greedy(model, data, batch, prefix, steps):
    outs = []
    with torch.inference_mode():
        for i in range(0, len(data), batch):
            ids = data[i:i + batch, :prefix]
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=steps, do_sample=False,
                                 min_new_tokens=steps, pad_token_id=0)
            outs.append(out[:, prefix:])
    return torch.cat(outs)


def agreement(pred, ref) -> tuple[float, float]:
    same = pred == ref
    first = torch.where(same.all(1), same.shape[1], (~same).float().argmax(1))
    return same.float().mean().item(), first.float().mean().item()


def load_inputs(args):
    """``(base model, held-out sequences [N, prefix + steps], calibration sequences, config kwargs, checkpoint)``."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    need = args.prefix + args.steps
    if args.tiny:
        from transformers import AutoModelForCausalLM, LlamaConfig

        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                          num_attention_heads=8, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                          pad_token_id=0, eos_token_id=1, bos_token_id=2)
        model = AutoModelForCausalLM.from_config(cfg).to(args.device, dtype).eval()
        gen = torch.Generator().manual_seed(1)
        held = torch.randint(3, 96, (args.seqs, need), generator=gen)
        calib = torch.randint(3, 96, (args.calib_seqs, need), generator=gen)
        sizes = dict(attn_group_size=2, ffn_group_size=32)
    else:
        from transformers import AutoTokenizer

        from wide.assets import resolve_model
        from wide.bench.models import build_model
        from wide.data import default_corpus_split

        model = build_model(args.model, None, args.device, dtype)
        tok = AutoTokenizer.from_pretrained(resolve_model(args.model))
        train, val = default_corpus_split()

        def take(docs, n):
            out = []
            for doc in docs:
                ids = tok(doc, add_special_tokens=False)["input_ids"]
                if len(ids) >= need:
                    out.append(ids[:need])
                if len(out) == n:
                    break
            return torch.tensor(out)

        held, calib = take(val, args.seqs), take(train, args.calib_seqs)
        sizes = dict(attn_group_size=args.attn_group_size, ffn_group_size=args.ffn_group_size)
    cfg = dict(sparsity=args.sparsity, **sizes)
    if args.checkpoint:
        from wide.io.checkpoint import read_metadata

        trained = read_metadata(args.checkpoint)["wide_config"]
        cfg = dict(sparsity=trained.sparsity, attn_group_size=trained.attn_group_size,
                   ffn_group_size=trained.ffn_group_size)
    return model, held.to(args.device), calib.to(args.device), cfg


def build(base, cfg, router):
    model = copy.deepcopy(base)
    return wide.apply_wide(model, wide.WideConfig(router=router, **cfg)).eval()


def main(argv=None) -> None:
    ap = common.parser(__doc__, device="cuda", dtype="bf16", outputs=False)  # --device cpu --dtype fp32: CPU runs
    ap.add_argument("--json", default=None, help="also write the rows, with date / GPU / commit / command, here")
    ap.add_argument("--model", default="smollm2-135m", help="asset, folder or hub name (with a tokenizer)")
    ap.add_argument("--tiny", action="store_true", help="a random tiny Llama and random tokens (CPU smoke run)")
    ap.add_argument("--checkpoint", default=None, help="trained routers for the per-token / coherent rows")
    ap.add_argument("--sparsity", type=float, default=0.5)
    ap.add_argument("--attn-group-size", type=int, default=3)
    ap.add_argument("--ffn-group-size", type=int, default=64)
    ap.add_argument("--period", type=int, default=8, help="batched_topk: decode steps between selections")
    ap.add_argument("--memory", type=float, default=0.5, help="batched_topk: memory decay per period")
    ap.add_argument("--prefill", default="shared", choices=["shared", "token"],
                    help="prefill mode of the threshold rows (batched top-k runs both)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--quality-batches", type=int, nargs="+", default=[4, 16], help="batches with greedy agreement")
    ap.add_argument("--seqs", type=int, default=16, help="held-out sequences (a multiple of every batch)")
    ap.add_argument("--calib-seqs", type=int, default=8, help="training-split sequences calibrating the threshold")
    ap.add_argument("--prefix", type=int, default=64)
    ap.add_argument("--steps", type=int, default=24)
    args = ap.parse_args(argv)
    common.setup(args)
    if any(args.seqs % b for b in args.batches):
        raise SystemExit(f"--seqs: {args.seqs} must be a multiple of every --batches entry {args.batches}")
    t0 = time.time()
    base, held, calib, cfg = load_inputs(args)

    per_token = build(base, cfg, "topk")
    label = "topk"
    if args.checkpoint:
        from wide.io.checkpoint import load_trained, read_metadata

        per_token = copy.deepcopy(base)
        wide.apply_wide(per_token, read_metadata(args.checkpoint)["wide_config"]).eval()
        load_trained(per_token, args.checkpoint, strict=False, prefixes=(".wide.routers.",))
        label = "trained"
    batched = {mode: build(base, cfg, functools.partial(BatchedTopKRouter, period=args.period, memory=args.memory,
                                                        prefill=mode)) for mode in ("shared", "token")}
    thresh = build(base, cfg, functools.partial(ThresholdRouter, prefill=args.prefill))
    # the threshold: per router, the quantile of batch-1 decode-step importance at which its rate is top-k's
    for i in range(len(calib)):
        decode_nll(thresh, calib[i:i + 1], args.prefix)
    for r in routers(thresh, ThresholdRouter):
        seen = torch.cat(r.seen).float()
        r.tau = float(torch.quantile(seen.flatten(), 1.0 - r.keep / r.num_groups))
    target = sum(r.expected_sparsity() for r in routers(batched["shared"])) / len(routers(batched["shared"]))

    def per_token_mode(model, on):
        for r in routers(model, ThresholdRouter):
            r.per_token = on

    variants = [
        ("dense", per_token, lambda m: wide.set_coherent_decode(m, None), True),
        (f"per-token ({label})", per_token, lambda m: wide.set_coherent_decode(m, None), False),
        (f"coherent ({label})", per_token, lambda m: wide.set_coherent_decode(m, 1), False),
        (f"batched top-k (period {args.period}, memory {args.memory:g})", batched["shared"], lambda m: None, False),
        (f"batched top-k (period {args.period}, memory {args.memory:g}, prefill per token)", batched["token"],
         lambda m: None, False),
        ("threshold (batch mean)", thresh, lambda m: per_token_mode(m, False), False),
        ("threshold (per token)", thresh, lambda m: per_token_mode(m, True), False),
    ]
    rows, dense_greedy = [], {}
    for b in args.batches:
        for name, model, setup, dense in variants:
            setup(model)
            rt = wide.modeling.runtime_of(model)
            if dense:
                with rt.routing_off():
                    nll, rates = _usage_nll(model, held, b, args.prefix)[0], [0.0, 0.0, 0.0]
                    if b in args.quality_batches:
                        dense_greedy[b] = greedy(model, held, b, args.prefix, args.steps)
            else:
                nll, rates = _usage_nll(model, held, b, args.prefix)
            row = dict(routing=name, batch=b, ppl=math.exp(nll), read_skip=rates[0], read_skip_by_weight=rates[1],
                       row_skip=rates[2], target=target)
            if b in args.quality_batches:
                pred = dense_greedy[b] if dense else greedy(model, held, b, args.prefix, args.steps)
                row["agreement"], row["common_prefix"] = agreement(pred, dense_greedy[b])
            rows.append(row)
            print(f"  {name:<64} b{b:<3} ppl {row['ppl']:9.2f}  read-skip {rates[0]:.3f} / {rates[1]:.3f} by weight"
                  f"  row-skip {rates[2]:.3f}" + (f"  agree {row['agreement']:.3f}" if "agreement" in row else ""),
                  flush=True)
        wide.set_coherent_decode(per_token, None)
    print(f"\n{args.model if not args.tiny else 'tiny random Llama'}, {len(held)} held-out sequences, prefix "
          f"{args.prefix}, {args.steps} decode steps; top-k rate {target:.3f} (target {args.sparsity}); "
          f"{time.time() - t0:.0f} s\n")
    print("| routing | batch | skipped by the step (kinds) | by weight | skipped per row | decode ppl "
          "| greedy agreement | common prefix |\n|---|---|---|---|---|---|---|---|")
    for r in rows:
        q = (f"{r['agreement']:.3f} | {r['common_prefix']:.1f}" if "agreement" in r else "– | –")
        print(f"| {r['routing']} | {r['batch']} | {r['read_skip']:.3f} | {r['read_skip_by_weight']:.3f} | "
              f"{r['row_skip']:.3f} | {r['ppl']:.2f} | {q} |")
    if args.json:
        common.write_json(args.json, dict(args=vars(args), rows=rows), common.meta(args.device))


if __name__ == "__main__":
    main()
