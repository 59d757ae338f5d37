"""Batched generation of prompts of many lengths (`wide.modeling.batched.generate_many`): equal-length batches
against batches of prompts within ``length_spread`` tokens, same prompts, one run.

For each ``--spreads`` value: wall time, generated tokens/s, and how many answers equal those of the first value
(greedy: in fp32 they should all agree; in bf16 a near-tie may flip the rest of an answer). With ``--model`` (an
asset or folder with a chat template) the prompts are chat questions built from a fixed word list; without, a
``--shape`` preset with random weights gets random token prompts of lengths in ``[--min-len, --max-len]``.

    python benchmarks/generate_batching.py --model smollm2-135m --device cpu --dtype fp32 --prompts 32 \\
        --max-new-tokens 40 --batch-size 16            # 2-core CPU, 2026-12-03: 69.0 s vs 13.6 s, 32/32 identical
    python benchmarks/generate_batching.py --model smollm2-135m --prompts 1000 --max-new-tokens 128 --batch-size 64
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import common  # noqa: E402

WORDS = ("the river city light number history music planet science water book garden animal machine language "
         "mountain winter market school bridge").split()


def chat_prompts(tokenizer, n: int) -> list[list[int]]:
    """``n`` chat-template prompts of varied lengths (questions of 3 to 22 words)."""
    out = []
    for i in range(n):
        words = " ".join(WORDS[(i + j) % len(WORDS)] for j in range(3 + (i * 7) % 20))
        ids = tokenizer.apply_chat_template([{"role": "user", "content": f"Explain briefly: {words}?"}],
                                            add_generation_prompt=True, tokenize=True)
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


def main(argv=None):
    ap = common.parser(__doc__, shape="tiny", layers=True)
    ap.add_argument("--model", default=None, help="a local model folder or asset name (default: --shape, random)")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--min-len", type=int, default=8, help="random prompts only")
    ap.add_argument("--max-len", type=int, default=64, help="random prompts only")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--spreads", default="0,32", help="comma list of length_spread values (the first is the reference)")
    args = ap.parse_args(argv)
    try:
        spreads = [int(s) for s in args.spreads.split(",")]
    except ValueError:
        raise SystemExit(f"generate_batching.py: --spreads takes integers, got {args.spreads!r}")
    if any(s < 0 for s in spreads) or args.prompts < 1 or not 1 <= args.min_len <= args.max_len:
        raise SystemExit("generate_batching.py: --spreads >= 0, --prompts >= 1 and 1 <= --min-len <= --max-len")
    device, dtype = common.setup(args)

    from wide.modeling.batched import generate_many
    from wide.modeling.generate import stop_token_ids

    if args.model:
        from wide.io.loading import load_model

        name = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype]
        loaded = load_model(args.model, device=str(device), dtype=name)
        model, tok = loaded.model, loaded.tokenizer
        model.config.use_cache = True
        prompts = chat_prompts(tok, args.prompts)
        stop = stop_token_ids(tok, model)
    else:
        model = common.random_model(args.shape, args.layers, device, dtype)
        g = torch.Generator().manual_seed(0)
        lengths = torch.randint(args.min_len, args.max_len + 1, (args.prompts,), generator=g).tolist()
        prompts = [torch.randint(3, model.config.vocab_size, (n,), generator=g).tolist() for n in lengths]
        stop = []
    rows, answers = [], {}
    lines = [f"{args.model or args.shape}, {len(prompts)} prompts of {len({len(p) for p in prompts})} distinct lengths "
             f"({min(map(len, prompts))}-{max(map(len, prompts))} tokens), {args.max_new_tokens} new tokens at most, "
             f"batch {args.batch_size}, {args.dtype}", "",
             "| length_spread | seconds | generated tokens | tokens / s | answers = first row's |",
             "|---:|---:|---:|---:|---:|"]
    for s in spreads:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        got = generate_many(model, prompts, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                            stop_ids=stop, length_spread=s)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        sec = time.perf_counter() - t0
        answers[s] = got
        same = sum(a == b for a, b in zip(got, answers[spreads[0]]))
        tokens = sum(map(len, got))
        rows.append({"length_spread": s, "seconds": sec, "generated_tokens": tokens, "tokens_per_s": tokens / sec,
                     "identical_to_first": same, "prompts": len(prompts)})
        lines.append(f"| {s} | {sec:.1f} | {tokens:,} | {tokens / sec:,.0f} | {same} / {len(prompts)} |")
    common.report(args, {"args": vars(args), "rows": rows}, "\n".join(lines), device)


if __name__ == "__main__":
    main()
