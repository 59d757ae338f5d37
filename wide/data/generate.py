"""``wide data generate``: self-generated training data from the dense model, as jsonl shards `wide fit` reads.

Two kinds of records, both with the training text under ``text`` (what ``--data.source <folder>`` reads):

- continuations: the first ``--prompt-tokens`` tokens of each training document of a text source (default: the
  default corpus; the held-out split is never used) continued by the model: ``text`` = prompt + continuation;
- chat answers (``--chat``): questions (``--prompt-file``, or ``--questions``: the training split of the asset's
  open QA tasks, `wide.data.prompts`) wrapped in the tokenizer's chat template and answered by the model: ``text``
  = the rendered conversation, question and answer, so an instruct model is tuned on its own chat distribution.

Generation runs batched through `wide.Generator` (graph-replayed decode steps on CUDA), greedy or with
``--temperature`` sampling. Shard ``i`` holds prompts ``[i·N, (i+1)·N)`` of the fixed prompt order and is written
atomically (a temporary file renamed into place), so a rerun skips the shards already there and resumes the rest;
``generate.json`` records the settings, and a rerun with other settings into the same folder is refused.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional, Sequence

__all__ = ["generate_data", "generate_parser"]

MANIFEST = "generate.json"

EPILOG = """\
examples:
  wide data generate smollm2-135m --out data/smollm2-self --max-prompts 2000 --max-new-tokens 128
  wide data generate qwen2.5-1.5b --chat --out data/qwen-chat --temperature 0.7 --batch-size 64
  wide fit --config recipes/smollm2-135m/calibrate.yaml --data.source data/smollm2-self
"""


def generate_parser(prog: str = "wide data generate") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Sample continuations of prose prompts, or chat answers, from the dense model into resumable "
                    "jsonl shards ({\"text\": ...} rows) that `wide fit --data.source <out>` reads.")
    p.add_argument("model", nargs="?", default="smollm2-135m", help="asset name, local folder or hub name")
    p.add_argument("--out", required=True, help="folder for the shards (created; existing shards are kept)")
    p.add_argument("--chat", action="store_true", help="chat answers to questions instead of prose continuations")
    p.add_argument("--source", default="default", help="text source of the continuation prompts (wide.data source)")
    p.add_argument("--prompt-tokens", type=int, default=64, help="prompt length of a continuation, in tokens")
    p.add_argument("--prompt-file", default=None, help="chat prompts: .txt (one per line) or .jsonl (prompt/text)")
    p.add_argument("--questions", default=None,
                   help="chat prompts: comma list of QA tasks (default all of sciq,nq_open,trivia_qa,commonsense_qa,"
                        "social_iqa; training split only)")
    p.add_argument("--system", default=None, help="a system message for every chat prompt")
    p.add_argument("--max-prompts", type=int, default=None, help="use at most this many prompts")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default); > 0: sampling")
    p.add_argument("--seed", type=int, default=17, help="seed of the sampling")
    p.add_argument("--shard-size", type=int, default=1000, help="records per shard")
    p.add_argument("--batch-size", type=int, default=32, help="prompts per batch")
    p.add_argument("--length-spread", type=int, default=32,
                   help="most tokens by which the prompts of one batch may differ in length (a longer row feeds the "
                        "rest of its prompt through the batch's first decode steps); 0: equal lengths only")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    return p


def _chat_prompts(args: argparse.Namespace, tokenizer) -> tuple[list[str], list[list[int]]]:
    from wide.data.prompts import DEFAULT_QUESTION_TASKS, prompt_file, question_prompts

    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(f"chat: the tokenizer of {args.model!r} has no chat template")
    if args.prompt_file and args.questions:
        raise ValueError("prompt-file: give either --prompt-file or --questions")
    tasks = DEFAULT_QUESTION_TASKS if not args.questions else [t.strip() for t in args.questions.split(",")]
    questions = prompt_file(args.prompt_file) if args.prompt_file else question_prompts(tasks)
    if args.max_prompts is not None:
        questions = questions[:args.max_prompts]
    ids = [tokenizer.apply_chat_template(_messages(args.system, q), add_generation_prompt=True, tokenize=True,
                                         return_dict=True)["input_ids"] for q in questions]
    return questions, ids


def _messages(system: Optional[str], question: str, answer: Optional[str] = None) -> list[dict[str, str]]:
    msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]
    return msgs + ([{"role": "assistant", "content": answer}] if answer is not None else [])


def _check_args(args: argparse.Namespace) -> None:
    for name in ("prompt_tokens", "max_new_tokens", "shard_size", "batch_size"):
        if getattr(args, name) < 1:
            raise ValueError(f"{name.replace('_', '-')}: must be >= 1, got {getattr(args, name)}")
    if args.length_spread < 0:
        raise ValueError(f"length-spread: must be >= 0, got {args.length_spread}")
    if args.max_prompts is not None and args.max_prompts < 1:
        raise ValueError(f"max-prompts: must be >= 1, got {args.max_prompts}")
    if args.temperature < 0:
        raise ValueError(f"temperature: must be >= 0, got {args.temperature}")
    if not args.chat and (args.prompt_file or args.questions or args.system):
        raise ValueError("prompt-file/questions/system: chat prompts need --chat")
    if not args.chat and args.source != "default":
        from wide.data.sources import check_source

        check_source(args.source)


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    keys = ("model", "chat", "source", "prompt_tokens", "prompt_file", "questions", "system", "max_prompts",
            "max_new_tokens", "temperature", "seed", "shard_size", "dtype")
    return {k: getattr(args, k) for k in keys}


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _check_manifest(out: Path, settings: dict[str, Any]) -> None:
    path = out / MANIFEST
    if path.is_file():
        have = json.loads(path.read_text())["settings"]
        diffs = [f"{k}: {have.get(k)!r} vs {v!r}" for k, v in settings.items() if have.get(k) != v]
        if diffs:
            raise ValueError(f"out: {out} holds shards made with other settings ({'; '.join(diffs)}); use another "
                             "folder or remove it")


def generate_data(args: argparse.Namespace, log=lambda msg: print(f"wide data generate: {msg}", file=sys.stderr)
                  ) -> dict[str, Any]:
    """Writes the shards of ``args`` (see :func:`generate_parser`) and returns the manifest."""
    _check_args(args)
    from wide.outputs import check_output_dir

    out = check_output_dir(args.out, "--out", results=())  # resumable: shards already there are kept
    settings = _settings(args)
    _check_manifest(out, settings)
    from wide.io.loading import load_model
    from wide.modeling.batched import generate_many
    from wide.modeling.generate import stop_token_ids

    loaded = load_model(args.model, device=args.device, dtype=args.dtype)
    model, tok = loaded.model, loaded.tokenizer
    model.config.use_cache = True
    if args.chat:
        questions, prompts = _chat_prompts(args, tok)
    else:
        from wide.data.prompts import source_prompts

        prompts = source_prompts(tok, args.source, args.prompt_tokens, limit=args.max_prompts)
        questions = None
    if not prompts:
        raise ValueError(f"source: no prompts (documents of more than {args.prompt_tokens} tokens) in {args.source!r}")
    stop = stop_token_ids(tok, model)
    out.mkdir(parents=True, exist_ok=True)
    n_shards = -(-len(prompts) // args.shard_size)
    written = skipped = tokens = 0
    t0 = time.perf_counter()
    for shard in range(n_shards):
        path = out / f"shard-{shard:05d}.jsonl"
        if path.is_file():
            skipped += 1
            continue
        lo, hi = shard * args.shard_size, min(len(prompts), (shard + 1) * args.shard_size)
        new = generate_many(model, prompts[lo:hi], max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                            stop_ids=stop, temperature=args.temperature, seed=args.seed * 100_003 + shard,
                            length_spread=args.length_spread)
        rows = []
        for k, completion_ids in enumerate(new):
            completion = tok.decode(completion_ids, skip_special_tokens=True)
            tokens += len(completion_ids)
            if args.chat:
                text = tok.apply_chat_template(_messages(args.system, questions[lo + k], completion), tokenize=False)
                rows.append({"text": text, "prompt": questions[lo + k], "completion": completion})
            else:
                prompt = tok.decode(prompts[lo + k], skip_special_tokens=True)
                rows.append({"text": prompt + completion, "prompt": prompt, "completion": completion})
        _write_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        written += 1
        log(f"{path.name}: {len(rows)} records ({shard + 1}/{n_shards}), {tokens / (time.perf_counter() - t0):.0f} "
            "generated tokens/s so far")
    manifest = {"settings": settings, "prompts": len(prompts), "shards": n_shards,
                "model_path": loaded.info["model_path"], "stop_ids": stop,
                # this run's own shards (none when every shard was already there)
                "generated_tokens": tokens, "seconds": round(time.perf_counter() - t0, 2)}
    _write_atomic(out / MANIFEST, json.dumps(manifest, indent=2) + "\n")
    log(f"{out}: {n_shards} shards ({written} written, {skipped} already there), {len(prompts)} prompts")
    return manifest


def generate_main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``wide data generate``; returns the exit status."""
    args = generate_parser().parse_args(list(sys.argv[3:] if argv is None else argv))
    try:
        generate_data(args)
    except ValueError as err:
        print(f"wide data generate: error: {err}", file=sys.stderr)
        return 2
    return 0
