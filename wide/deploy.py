"""``wide export`` and ``wide generate``: from a ``wide fit`` checkpoint to a routed model folder, and text from it.

``wide export`` loads the base model with a trained-tensor checkpoint (stage 1 or 2; LoRA merged into the
weights), and writes the folder of `wide.export` with the tokenizer, atomically: it is written beside the
destination and renamed into place, so a failure leaves no half-written folder and an existing one untouched.

``wide generate`` restores such a folder with `wide.load` (routed kernels on) and continues prompts greedily
through one `wide.Generator` (on CUDA: chunks and decode steps replayed from CUDA graphs kept across prompts),
printing each completion with its speed and the share of routed weights the model skipped on that text (one
extra eager forward over prompt and completion). With ``--compare`` every prompt also runs through the dense
backbone (the same model with routing off, `wide.Generator.compare`), and both sides' tokens/s are printed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional, Sequence

DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")

EXPORT_EPILOG = """\
examples:
  wide export --checkpoint runs/wide/version_0/wide/routers.safetensors --out exported/smollm2-wide50
  wide export --checkpoint runs/lora/wide/routers.safetensors --dtype bfloat16 --out exported/m --force
"""

GENERATE_EPILOG = """\
examples:
  wide generate exported/smollm2-wide50 --prompt "The capital of France is" --max-new-tokens 32
  wide generate exported/smollm2-wide50 --chat --prompt "Name three primes." --json out.json
  wide generate exported/smollm2-wide50 --prompt-file prompts.txt --max-new-tokens 128 --compare
"""


def export_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="wide export", epilog=EXPORT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Merge a `wide fit` checkpoint (routers, LoRA) into its base model and write a folder that "
                    "`wide.load` and `wide generate` restore: HF config + safetensors weights, routers.safetensors "
                    "(routers + WideConfig + the base model's identity), wide.json and the tokenizer.")
    p.add_argument("model", nargs="?", default=None,
                   help="base model: asset name, local folder or hub name (default: the one the checkpoint was "
                        "trained on)")
    p.add_argument("--checkpoint", required=True,
                   help="trained-tensor .safetensors from `wide fit` (stage 1 or 2), or its folder")
    p.add_argument("--out", required=True, help="folder to write (must not exist or be empty, unless --force)")
    p.add_argument("--force", action="store_true", help="replace an existing --out folder")
    p.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES,
                   help="weights dtype in the folder (auto: float32 when merging on CPU, bfloat16 on CUDA)")
    p.add_argument("--device", default="cpu", help="where to merge (default cpu)")
    p.add_argument("--lora-alpha", type=float, default=None,
                   help="LoRA alpha when the checkpoint does not record it (default 32, LoRARecovery's)")
    return p


def export_main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``wide export``; returns the exit status."""
    argv = list(sys.argv[2:] if argv is None else argv)
    args = export_parser().parse_args(argv)
    from wide.io import export, load_model, read_metadata
    from wide.outputs import check_output_dir

    try:
        out = check_output_dir(args.out, "--out", force=args.force)
        read_metadata(args.checkpoint)  # a bad checkpoint fails here, before the model loads
        t0 = time.perf_counter()
        loaded = load_model(args.model, checkpoint=args.checkpoint, device=args.device,
                            dtype=args.dtype, lora_alpha=args.lora_alpha)
        model = loaded.model
        model.config.use_cache = True  # load_model turns the cache off for scoring; generation wants it
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        try:
            export(model, tmp, tokenizer=loaded.tokenizer)
            info = {k: loaded.info[k] for k in ("model", "model_path", "method", "routing", "dtype")}
            info["checkpoint"] = {k: v for k, v in (loaded.info["checkpoint"] or {}).items() if k != "extra"}
            meta = json.loads((tmp / "wide.json").read_text())
            (tmp / "wide.json").write_text(json.dumps({**meta, "exported_from": info}, indent=2, default=str))
            if out.exists():
                shutil.rmtree(out)
            tmp.rename(out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    except ValueError as err:
        print(f"wide export: error: {err}", file=sys.stderr)
        return 2
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"wide export: wrote {out} ({size / 2**20:.1f} MiB, {loaded.info['method']}, "
          f"target sparsity {model.wide_config.sparsity}, {loaded.info['dtype']}) in {time.perf_counter() - t0:.1f} s")
    return 0


def generate_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="wide generate", epilog=GENERATE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Greedy continuations from a folder written by `wide export` (or `wide.export`), through the "
                    "routed kernels and one wide.Generator, with speed and realized sparsity per prompt.")
    p.add_argument("model", help="folder written by `wide export`")
    p.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable)")
    p.add_argument("--prompt-file", default=None, help="a text file: one prompt per line")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--chat", action="store_true", help="wrap each prompt in the tokenizer's chat template as a user turn")
    p.add_argument("--device", default="auto", help="auto (CUDA if present), cpu, cuda, cuda:1 ...")
    p.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES,
                   help="auto: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--backend", default=None, help="kernel backend: auto, torch, gather, triton (default: the folder's)")
    p.add_argument("--no-graphs", action="store_true", help="run every forward eagerly (no CUDA graphs)")
    p.add_argument("--weight-layout", choices=["row", "column"], default="row",
                   help="store o_proj / down_proj column-major for the routed decode GEMVs (wide.set_weight_layout; "
                        "measured slower than row-major on an H100, kept for A/Bs)")
    p.add_argument("--prefill", choices=["routed", "dense"], default="routed",
                   help="routed (default): the prompt through the routers too; dense: the prompt with routing off (the "
                        "dense model's cache and first token, no prefill speed-up), only the decode steps routed; the "
                        "skipped shares printed are then the new tokens'")
    p.add_argument("--compare", action="store_true",
                   help="also run every prompt through the dense backbone (this model with routing off: HF's own "
                        "layers, same dtype and graph setting) and print tokens/s of both sides, routed/dense, the "
                        "skipped share and how far the greedy tokens agree; both sides decode exactly "
                        "--max-new-tokens tokens (EOS ignored), timed after one untimed warm-up run of every prompt")
    p.add_argument("--json", default=None, help="also write the completions and numbers here")
    return p


def _prompts(args) -> list[str]:
    prompts = list(args.prompt)
    if args.prompt_file:
        path = Path(args.prompt_file)
        if not path.is_file():
            raise ValueError(f"prompt-file: {path} is not a file")
        prompts += [line for line in path.read_text().splitlines() if line.strip()]
    if not prompts:
        raise ValueError("prompt: give at least one --prompt or a --prompt-file")
    if any(not p.strip() for p in prompts):
        raise ValueError("prompt: an empty prompt")
    return prompts


def _check_folder(path: Path) -> None:
    if not path.is_dir():
        raise ValueError(f"model: {path} is not a folder")
    for name in ("config.json", "routers.safetensors"):
        if not (path / name).is_file():
            raise ValueError(f"model: {path} has no {name}; write it with `wide export` (or wide.export)")
    if not any((path / n).is_file() for n in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        raise ValueError(f"model: {path} holds no tokenizer; export with one (`wide export` saves it)")


def generate_main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``wide generate``; returns the exit status."""
    argv = list(sys.argv[2:] if argv is None else argv)
    args = generate_parser().parse_args(argv)
    from wide.outputs import check_output_file

    try:
        if args.json:
            check_output_file(args.json, "--json")
        if args.max_new_tokens < 1:
            raise ValueError(f"max-new-tokens: must be >= 1, got {args.max_new_tokens}")
        prompts = _prompts(args)
        folder = Path(args.model).expanduser()
        _check_folder(folder)
        import torch
        from transformers import AutoTokenizer

        import wide
        from wide.io import resolve_device, resolve_dtype

        tok = AutoTokenizer.from_pretrained(folder)
        if args.chat and not getattr(tok, "chat_template", None):
            raise ValueError(f"chat: the tokenizer in {folder} has no chat template")
        dev = resolve_device(args.device)
        if args.no_graphs is False and dev.type != "cuda":
            args.no_graphs = True
        ids = [_encode(tok, p, args.chat) for p in prompts]
        model = wide.load(folder, dtype=resolve_dtype(args.dtype, dev), device=str(dev), backend=args.backend,
                          weight_layout=args.weight_layout)
        longest = max(len(i) for i in ids) + args.max_new_tokens
        cache = -(-longest // 128) * 128
        from wide.modeling.generate import DEFAULT_CHUNKS

        # chunks pay off only replayed from graphs; eagerly one forward is faster
        gen = wide.Generator(model, batch_size=1, max_cache_len=cache,
                             chunk=None if args.no_graphs else DEFAULT_CHUNKS, graphs=not args.no_graphs,
                             prefill=args.prefill)
        extra = {}
        if args.compare:
            result = gen.compare([torch.tensor([i], device=dev) for i in ids], max_new_tokens=args.max_new_tokens)
            from wide.modeling.generate import stop_token_ids

            records = _compare_records(tok, prompts, result, stop_token_ids(tok, gen.model))
            print(_compare_summary(result))
            extra["total"] = result.to_dict()["total"]
        else:
            records = []
            for prompt, p_ids in zip(prompts, ids):
                records.append(_generate_one(gen, tok, prompt, torch.tensor([p_ids], device=dev), args.max_new_tokens))
                _print(records[-1])
    except ValueError as err:
        print(f"wide generate: error: {err}", file=sys.stderr)
        return 2
    dtype = str(model.dtype).removeprefix("torch.")
    note = "" if args.no_graphs or args.compare else \
        " (the first prompt's time includes compiling kernels and capturing graphs)"
    dense = ", prompts dense" if args.prefill == "dense" else ""
    print(f"wide generate: {len(records)} prompt(s) on {dev} ({dtype}, target sparsity {model.wide_config.sparsity}"
          f"{dense}){note}", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps({"model": str(folder), "device": str(dev), "dtype": dtype,
                                               "graphs": gen.graphs, "prefill": args.prefill, "records": records,
                                               **extra,
                                               "command": ["wide", "generate", *argv]}, indent=2))
    return 0


def _generate_one(gen, tok, prompt: str, x, max_new_tokens: int) -> dict[str, Any]:
    """One prompt ``x [1, T]`` through ``gen``, timed, up to its first EOS; its record."""
    import torch

    from wide.modeling.compare import _dense_prompt, skipped_share
    from wide.modeling.generate import cut_at_stop, stop_token_ids

    stops = stop_token_ids(tok, gen.model)
    dev = x.device
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    y = gen.generate(x, max_new_tokens=max_new_tokens, eos_token_id=stops or None)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    wall = time.perf_counter() - t0
    new = cut_at_stop(y[0, x.shape[1]:].tolist(), stops)
    return {"prompt": prompt, "prompt_tokens": x.shape[1], "new_tokens": len(new), "tokens": new,
            "completion": tok.decode(new, skip_special_tokens=True), "wall_s": wall,
            "tokens_per_s": len(new) / wall if wall > 0 else None,
            "skipped": skipped_share(gen.model, y[:, : x.shape[1] + len(new)], _dense_prompt(gen, x))}


def _encode(tok, prompt: str, chat: bool) -> list[int]:
    if chat:
        ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)  # a BatchEncoding from transformers 5 on
    return tok(prompt)["input_ids"]


def _skipped(sk: dict[str, float]) -> str:
    kinds = ", ".join(f"{k} {v:.1%}" for k, v in sk.items() if k not in ("total", "by_weight"))
    return f"skipped {kinds}, {sk['total']:.1%} kinds averaged, {sk['by_weight']:.1%} of routed weights"


def _print(rec: dict[str, Any]) -> None:
    speed = f"{rec['tokens_per_s']:.1f} tokens/s" if rec["tokens_per_s"] else "-"
    print(f"### {rec['prompt']}\n{rec['completion']}\n"
          f"[{rec['prompt_tokens']} prompt + {rec['new_tokens']} new tokens, {rec['wall_s'] * 1e3:.0f} ms, {speed}; "
          f"{_skipped(rec['skipped'])}]\n")


def _text(tok, tokens: list[int], stops) -> str:
    """The completion as text, up to its first stop token (``--compare`` decodes past it)."""
    from wide.modeling.generate import cut_at_stop

    return tok.decode(cut_at_stop(tokens, stops), skip_special_tokens=True)


def _compare_records(tok, prompts: list[str], result, stops) -> list[dict[str, Any]]:
    """``--compare``: one record per prompt (printed as it is made) from `wide.Generator.compare`'s result."""
    records = []
    for prompt, pc in zip(prompts, result.prompts):
        rec = {"prompt": prompt, **pc.to_dict()}
        for side in ("dense", "routed"):
            rec[side]["completion"] = _text(tok, rec[side]["tokens"][0], stops)
        records.append(rec)
        d, r = rec["dense"], rec["routed"]
        first = rec["first_divergence"]
        dense_text, where = ("", "identical") if first is None else \
            (f"dense: {d['completion']}\n", f"first divergence at new token {first}")
        print(f"### {prompt}\n{r['completion']}\n{dense_text}"
              f"[{rec['prompt_tokens']} prompt + {r['new_tokens']} new tokens per side; dense "
              f"{d['tokens_per_s']:.1f} tokens/s, routed {r['tokens_per_s']:.1f} tokens/s, routed/dense "
              f"{rec['ratio']:.2f}x; {_skipped(rec['skipped'])}; greedy tokens agree {rec['matching']}/"
              f"{r['new_tokens']} ({where})]\n")
    return records


def _compare_summary(result) -> str:
    """``--compare``: the totals over every prompt, and what both sides ran under."""
    graphs = "CUDA graphs" if result.graphs else "eager, no CUDA graphs"
    same = sum(p.first_divergence is None for p in result.prompts)
    n, lines = result.new_tokens, []
    lines.append(f"dense vs routed: {len(result.prompts)} prompt(s) on {result.device} ({result.dtype}, {graphs}); "
                 f"each side {result.max_new_tokens} new tokens per prompt (EOS ignored), greedy, timed after one "
                 "untimed warm-up run of every prompt; dense = the same model with routing off")
    for side in ("dense", "routed"):
        wall = sum(getattr(p, side).wall_s for p in result.prompts)
        lines.append(f"{side + ':':8}{result.tokens_per_s(side):.1f} tokens/s ({n} tokens in {wall:.2f} s)")
    lines.append(f"routed/dense: {result.ratio:.2f}x; {_skipped(result.skipped)}")
    lines.append(f"greedy tokens agree {result.matching}/{n} ({same} of {len(result.prompts)} prompt(s) identical)")
    return "\n".join(lines)
