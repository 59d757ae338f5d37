"""``wide bench``: end-to-end prefill latency and decode throughput, dense vs routed, in one run.

The command line; the package docstring (`wide.bench`) says what is timed and how.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from typing import Any, Optional

# imported on first use, so that `wide bench --help` and bad flags answer without torch
_LAZY = {"run_latency": "wide.bench.latency", "quality_rows": "wide.bench.quality"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _backend(name: str) -> str:
    from wide.kernels.backends.base import check_backend

    try:
        return check_backend(name)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("backend: ")) from None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="wide bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="local model / asset (default: random Llama-3.1-8B shape)")
    p.add_argument("--layers", type=int, default=None, help="keep only the first N decoder layers")
    p.add_argument("--checkpoint", default=None,
                   help="a `wide fit` output (.safetensors) instead of synthetic masks: its routers, and a stage-2 "
                        "file's adapter merged into the weights as deployed")
    p.add_argument("--lora-alpha", type=float, default=None,
                   help="LoRA alpha of a stage-2 --checkpoint that does not record it (default 32, LoRARecovery's)")
    p.add_argument("--sparsity", type=float, nargs="+", default=[0.0, 0.25, 0.5, 0.75],
                   help="target sparsities (0: the routed overhead with every group executing)")
    p.add_argument("--prefill", type=int, nargs="*", default=[1024, 4096, 16384])
    p.add_argument("--prefill-chunk", type=int, nargs="*", default=[],
                   help="also time prefills cut into chunks of this many tokens, each replayed from one graph "
                        "(wide.Generator; both sides)")
    p.add_argument("--decode-batch", type=int, nargs="*", default=[1, 4, 16])
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--attn-group-size", type=int, default=None)
    p.add_argument("--ffn-group-size", type=int, default=128)
    p.add_argument("--backend", default="auto", type=_backend,
                   help="auto (the fastest available per op), torch, gather, triton, or a registered plug-in backend")
    p.add_argument("--kernel-option", action="append", default=[], metavar="NAME=0|1",
                   help="an A/B switch of the fused kernels' default configs (wide.kernels.KernelOptions: "
                        "persistent_mn, skinny_swap, decode_fold, ffn_experts, gemm_k_experts, decode_norm_route, "
                        "decode_qkv, decode_qkv_split, decode_residual, decode_route, decode_route_attn, route_warm, "
                        "attn_pack, narrow_swiglu, router_prefetch), e.g. "
                        "skinny_swap=0; "
                        "repeatable")  # spelled out: this parser imports no torch (a test holds it to the fields)
    p.add_argument("--ids", choices=["auto", "random", "text"], default="auto",
                   help="token ids every timed forward reads: random ids below 1000, or text (--text-source in the "
                        "model's tokenizer; trained routers skip another share of random ids than of text); auto: "
                        "text with --checkpoint when the model has a tokenizer, else random")
    p.add_argument("--text-source", default="default",
                   help="the text of --ids text: 'default' (the default corpus's held-out split, wide eval's "
                        "perplexity set) or any wide.data source (.txt/.jsonl/.parquet, folder, prose corpus name)")
    p.add_argument("--router", choices=["random", "lowrank"], default="random",
                   help="synthetic masks' source: random draws at the rate (two launches per layer and kind), or "
                        "untrained low-rank routers whose biases are calibrated to the rate (a trained router's "
                        "kernels and cost)")
    p.add_argument("--coherent", action="store_true", help="also time batch-coherent decode routing")
    p.add_argument("--coherent-refresh", type=int, default=1)
    p.add_argument("--coherent-keep-scale", type=float, nargs="+", default=[1.0],
                   help="coherent decode keeps this multiple of the rows' mean group count (one row per value)")
    p.add_argument("--coherent-memory", type=float, default=0.0,
                   help="coherent decode's EMA memory (0: the current batch's scores only)")
    p.add_argument("--dense-compile", nargs="?", const="default", default=None, metavar="MODE",
                   help="also time the dense decode step with the whole forward under torch.compile, captured in the "
                        "same CUDA graph (inductor mode 'default' or 'max-autotune-no-cudagraphs', or a dynamo "
                        "backend's name); the fastest dense variant stays the baseline. Minutes of compile a batch")
    p.add_argument("--no-graphs", action="store_true")
    p.add_argument("--weight-layout", choices=["row", "column"], default="row",
                   help="storage of the routed model's o_proj / down_proj weights (wide.set_weight_layout): row-major "
                        "as loaded, or column-major (each skipped column group one contiguous block); the dense "
                        "baseline keeps the faster of its loaded step and the routed model's own with routing off")
    p.add_argument("--no-overlap-routing", action="store_true",
                   help="decide a decode step's attention mask on the main stream, not beside the K/V projections")
    p.add_argument("--compile", nargs="?", const="inductor", default=None, metavar="BACKEND",
                   help="torch.compile the forward on both sides (default backend: inductor); the routed ops "
                        "stay eager graph breaks, the glue between them is compiled")
    p.add_argument("--fuse-glue", nargs="?", const="inductor", default=None, metavar="BACKEND",
                   help="compile HF's RMS norms, RoPE and the dense MLP's act*up on both sides (wide.fuse_glue; "
                        "default backend: inductor): seconds to compile, CUDA-graph capturable")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--device", default=None, help="cuda, cpu, cuda:1 ... (default: cuda when present, else cpu)")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--json", default=None, help="write the rows as JSON here")
    p.add_argument("--quality", action="store_true",
                   help="instead of timing: decode-time perplexity of dense / per-token / coherent routing "
                        "(needs --model with a tokenizer and --checkpoint or synthetic routers)")
    p.add_argument("--quality-seqs", type=int, default=16)
    p.add_argument("--quality-prefix", type=int, default=64)
    p.add_argument("--quality-steps", type=int, default=32)
    return p


def text_ids(args: argparse.Namespace):
    """The token stream of ``--ids text`` (or ``auto`` with a checkpoint), or ``None`` for random ids; sets
    ``args.ids`` to what was chosen. ``auto`` on a model without a tokenizer falls back to random ids and says so."""
    if args.ids == "random":
        return None
    from wide.bench.models import text_tokens
    from wide.data.tokens import load_tokenizer

    try:
        tokenizer = load_tokenizer(args.model)
    except Exception as err:  # noqa: BLE001 - any failure means: no tokenizer to cut text with
        if args.ids == "text":
            raise SystemExit(f"wide bench: --ids text needs the model's tokenizer; {args.model!r} has none "
                             f"({err})") from None
        print(f"wide bench: --ids auto: random ids ({args.model!r} has no tokenizer)", file=sys.stderr)
        args.ids = "random"
        return None
    try:
        stream = text_tokens(tokenizer, args.text_source)
    except ValueError as err:
        raise SystemExit(f"wide bench: --text-source: {err}") from None
    args.ids = "text"
    return stream


def bench_main(argv: Optional[list[str]] = None) -> int:
    """Entry point of ``wide bench``; returns the exit status (bad flags exit with one line naming the flag)."""
    args = parser().parse_args(argv)
    for v in args.sparsity:
        if not 0 <= v < 1:
            raise SystemExit(f"wide bench: --sparsity values must be in [0, 1), got {v}")
    for v in args.prefill_chunk:
        if v < 16:
            raise SystemExit(f"wide bench: --prefill-chunk values must be at least 16 tokens, got {v}")
    for v in args.coherent_keep_scale:
        if not 0 < v <= 16:
            raise SystemExit(f"wide bench: --coherent-keep-scale values must be in (0, 16], got {v}")
    if args.dense_compile and args.compile:
        raise SystemExit("wide bench: --dense-compile times a compiled dense step beside the eager ones; --compile "
                         "already compiles both sides' forwards")
    if args.checkpoint and args.router != "random":
        raise SystemExit("wide bench: --router picks the synthetic masks' source; --checkpoint brings trained routers")
    if args.ids == "auto" and not (args.checkpoint and args.model):
        args.ids = "random"  # (with both, `text_ids` takes text when the model has a tokenizer)
    if args.ids == "text" and not args.model:
        raise SystemExit("wide bench: --ids text needs --model with a tokenizer (the default 8B shape has none)")
    if args.ids != "random" and args.text_source != "default":
        from wide.data.sources import check_source

        try:
            check_source(args.text_source)
        except ValueError as err:
            raise SystemExit(f"wide bench: --text-source: {err}") from None
    if args.json:
        from wide.outputs import check_output_file

        try:
            check_output_file(args.json, "--json")
        except ValueError as err:
            raise SystemExit(f"wide bench: {err}") from None
    import torch

    from wide.bench.dense import compile_options
    from wide.bench.floor import measure_bandwidth
    from wide.bench.report import format_quality_table, format_table, kernel_switches, latency_notes, write_json
    from wide.kernels import KernelOptions, use_kernel_options

    this = sys.modules[__name__]  # run_latency/quality_rows looked up here, where a test may replace them
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"

    try:
        options = KernelOptions.parse(args.kernel_option)
        if args.dense_compile:
            compile_options(args.dense_compile)
    except ValueError as err:
        raise SystemExit(f"wide bench: {err}") from None
    ids = None if args.quality else text_ids(args)  # before any weights load
    t0 = time.time()
    with use_kernel_options(options):
        if args.quality:
            rows = this.quality_rows(args)
            print(format_quality_table(rows))
            if args.json:
                write_json(args.json, {"args": vars(args), "quality": rows})
            return 0
        # the device's bandwidth, for the decode rows' floors: measured first, with the device's memory free
        bandwidth = measure_bandwidth(args.device) if args.decode_batch else None
        rows = this.run_latency(args, bandwidth, ids)
    print(format_table(rows))
    switches = kernel_switches()
    for line in latency_notes(args, rows, switches, bandwidth):
        print(line)
    if options.changed():
        print("kernel options: " + ", ".join(f"{k}={int(v)}" for k, v in options.changed().items()))
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    print(f"\n{dev}, torch {torch.__version__}, {time.time() - t0:.0f} s")
    if args.json:
        write_json(args.json, {"device": dev, "torch": torch.__version__, "args": vars(args), "env": switches,
                               "kernel_options": options.changed(), "bandwidth": bandwidth, "rows": rows})
    return 0
