"""Do a bench decode row's tokens route as they would in generation? Trained routers' skip rate by routed weight
(what decode speed follows) of the same text tokens three ways:

- **prefill**: one forward over the prompt and the ``--tokens`` tokens after it (each token's rate, by position);
- **runner**: `wide.bench.runners.DecodeRunner`'s steps (eager, dynamic cache): token ``i`` at ``context + i`` with
  tokens ``0 .. i-1`` in the cache, as generation decodes them; it must match prefill token for token;
- **holes**: every token fed right after the prompt, the tokens before it missing (how `wide bench` fed a decode
  row until 2026-12-04): a text with holes, which trained routers route otherwise.

A CPU is enough (``--device cpu --dtype fp32``: the decisions are the model's, not the kernels'): Qwen2.5-Coder-1.5B
with issue 22's 20M-token routers, ``--context 4096 --tokens 32``, took 3.5–5 min on 2 cores (2026-12-04).

    PYTHONPATH=. python3 benchmarks/decode_rates.py --model qwen2.5-1.5b --checkpoint routers.safetensors \
        --device cpu --dtype fp32 --context 4096 --tokens 32
"""
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import common  # noqa: E402


def per_token_skip(model) -> torch.Tensor:
    """``[B, T]`` share of the routed weights each token of ``model``'s last forward skipped."""
    import wide

    st = wide.sparsity_stats(model)
    kept = sum((st.token_active[k].float() * st.weights[k]).sum(-1) for k in st.kinds)
    return 1 - kept / sum(st.weights[k].sum() for k in st.kinds)


def main(argv=None) -> None:
    ap = common.parser(__doc__)
    ap.add_argument("--model", required=True, help="an asset name or model folder with a tokenizer")
    ap.add_argument("--checkpoint", required=True, help="trained routers (.safetensors)")
    ap.add_argument("--context", type=int, default=4096, help="prompt tokens (the bench's decode context)")
    ap.add_argument("--tokens", type=int, default=32, help="decode tokens after the prompt")
    ap.add_argument("--offset", type=int, default=0, help="where the prompt starts in the token stream")
    ap.add_argument("--text-source", default="default",
                    help="the text (a wide.data source, as `wide bench --text-source`; default: the default corpus's "
                         "held-out split)")
    args = ap.parse_args(argv)
    device, dtype = common.setup(args)
    if args.context < 1 or args.tokens < 1:
        raise SystemExit("decode_rates.py: --context and --tokens must be positive")
    if not Path(args.checkpoint).is_file():
        raise SystemExit(f"decode_rates.py: --checkpoint {args.checkpoint} is not a file")

    import wide
    from transformers import DynamicCache

    from wide.bench.models import text_tokens, use_text_ids
    from wide.bench.runners import DecodeRunner
    from wide.data.tokens import load_tokenizer
    from wide.io.checkpoint import load_trained, read_metadata

    t0 = time.time()
    model = common.load_model(args.model, "llama-8b", None, device, dtype)
    wide.apply_wide(model, read_metadata(args.checkpoint)["wide_config"])
    load_trained(model, args.checkpoint)
    model.eval()
    stream = text_tokens(load_tokenizer(args.model), args.text_source)
    stream = torch.roll(stream, -args.offset)  # the runner cuts its one row's prompt from the stream's start
    use_text_ids(model, stream)
    C, K = args.context, args.tokens
    ids = stream[torch.arange(C + K) % stream.numel()][None].to(device)
    with torch.inference_mode():
        model(input_ids=ids)
        prefill = per_token_skip(model)[0].float().cpu()
        runner = DecodeRunner(model, 1, C, graphs=False, tokens=K)
        seq = []
        for i in range(runner.tokens):
            runner._one(i)
            seq.append(float(per_token_skip(model)[0, 0]))
        cache = DynamicCache(config=model.config)
        model(input_ids=ids[:, :C], past_key_values=cache, use_cache=True, logits_to_keep=1)
        holes = []
        for i in range(K):
            model(input_ids=ids[:, C + i:C + i + 1], past_key_values=cache, use_cache=True)
            cache.crop(-1)
            holes.append(float(per_token_skip(model)[0, 0]))

    def mean(xs):
        return sum(xs) / len(xs)

    after = prefill[C:].tolist()
    step = max(1, (C + K) // 16)
    bands = [(a, min(a + step, C + K), float(prefill[a:a + step].mean())) for a in range(0, C + K, step)]
    worst = max(abs(p - r) for p, r in zip(after, seq))
    lines = [
        f"{args.model}, {args.checkpoint}, {args.dtype} on {device.type}, context {C}, {K} decode tokens, "
        f"offset {args.offset} ({time.time() - t0:.0f} s)", "",
        "| tokens | skipped by routed weight |", "|---|---|",
        f"| the prompt, prefill | {float(prefill[:C].mean()):.3f} |",
        f"| the {K} after it, prefill | {mean(after):.3f} |",
        f"| the {K} after it, `DecodeRunner` (in sequence) | {mean(seq):.3f} |",
        f"| the {K} after it, each right after the prompt (holes) | {mean(holes):.3f} |", "",
        "prefill by position: " + ", ".join(f"{a}-{b} {r:.3f}" for a, b, r in bands), "",
        "per token, prefill / runner / holes: " + ", ".join(
            f"{p:.3f}/{r:.3f}/{h:.3f}" for p, r, h in zip(after, seq, holes)), "",
        f"runner against prefill: largest per-token difference {worst:.2e}"]
    common.report(args, dict(prompt=float(prefill[:C].mean()), prefill=after, runner=seq, holes=holes,
                             bands=bands), "\n".join(lines), device)


if __name__ == "__main__":
    main()
