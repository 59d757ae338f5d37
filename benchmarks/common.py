"""What every script under ``benchmarks/`` shares: flags, shape presets, timers and the provenance of a result.

- ``parser(__doc__, ...)``: the common flags (``--device``, ``--dtype``, ``--shape``, ``--layers``, ``--json``,
  ``--md``, ``--kernel-option``), each script adding its own; ``setup(args)`` checks them (one error naming the
  flag, before any compute) and returns the device and dtype.
- Shape presets (``--shape``): ``llama-8b`` (Llama-3.1-8B, what `wide bench` and the kernel table time),
  ``qwen2.5-1.5b`` (Qwen2.5-1.5B, the calibration recipes' model), ``smollm2-135m`` (the default model) and
  ``tiny`` (CPU runs in CI), random weights,
  nothing downloaded.
- Timers: ``graph_ms`` (a CUDA graph of back-to-back calls, replayed, CUDA events), ``bench_ms`` (Triton's
  ``do_bench``, L2 flushed), ``event_ms`` (CUDA events around eager calls), ``wall_ms`` (host clock, synced).
- ``report(args, payload, markdown)``: prints the table and writes it to ``--json`` / ``--md`` with the date, GPU,
  commit and command line (``meta()``), so a number in BENCHMARKS.md can always say where it came from.

Scripts put the repository root on ``sys.path`` and import this as ``benchmarks.common`` (the tests' own
``kernels`` package would shadow a bare ``import kernels``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import torch

ROOT = Path(__file__).resolve().parents[1]

QWEN25_15B = dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                  num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1e6,
                  rms_norm_eps=1e-6, tie_word_embeddings=True)
"""Qwen2.5(-Coder)-1.5B's architecture (its config.json); weights random."""

SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192, rope_theta=1e5,
                    rms_norm_eps=1e-5, tie_word_embeddings=True)
"""SmolLM2-135M(-Instruct)'s architecture (a Llama); weights random: profiles without the asset."""

TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=4096, rms_norm_eps=1e-5,
            tie_word_embeddings=False)
"""A Llama of a few hundred thousand weights: CPU runs of a script's whole path (CI, smoke runs)."""


def _llama_8b() -> dict:
    from wide.bench.models import LLAMA_8B  # the bench's own preset: one definition of the 8B shape

    return LLAMA_8B


SHAPES: dict[str, tuple[str, Callable[[], dict]]] = {
    "llama-8b": ("LlamaConfig", _llama_8b),
    "qwen2.5-1.5b": ("Qwen2Config", lambda: QWEN25_15B),
    "smollm2-135m": ("LlamaConfig", lambda: SMOLLM2_135M),
    "tiny": ("LlamaConfig", lambda: TINY),
}
"""``--shape`` presets: name -> (transformers config class, its keyword arguments)."""

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


# --------------------------------------------------------------------------------------------------
# flags
# --------------------------------------------------------------------------------------------------


def parser(doc: Optional[str], *, device: Optional[str] = "cuda", dtype: Optional[str] = "bf16",
           shape: Optional[str] = None, layers: bool | int = False, outputs: bool = True,
           kernel_options: bool = False) -> argparse.ArgumentParser:
    """An argument parser with the common flags; a ``None`` default leaves that flag out.

    Args:
        doc: the script's docstring (its first paragraph heads ``--help``, the rest is the epilog).
        device: default of ``--device``.
        dtype: default of ``--dtype``.
        shape: default of ``--shape`` (a `SHAPES` name).
        layers: add ``--layers`` (keep the first N decoder layers): ``True`` (default: all of them) or its default.
        outputs: add ``--json`` / ``--md``.
        kernel_options: add ``--kernel-option NAME=0|1`` (`wide.kernels.KernelOptions`, repeatable).
    """
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if device is not None:
        ap.add_argument("--device", default=device, help=f"cuda or cpu (default: {device})")
    if dtype is not None:
        ap.add_argument("--dtype", default=dtype, choices=sorted(DTYPES))
    if shape is not None:
        ap.add_argument("--shape", default=shape, choices=sorted(SHAPES),
                        help="model shape with random weights (default: %(default)s)")
    if layers is not False:
        ap.add_argument("--layers", type=int, default=None if layers is True else layers,
                        help="keep only the first N decoder layers (default: %(default)s)")
    if outputs:
        ap.add_argument("--json", default=None, help="also write the results, with date / GPU / commit / command, "
                                                     "as JSON here")
        ap.add_argument("--md", default=None, help="also write the printed table, with the same header, here")
    if kernel_options:
        import dataclasses

        from wide.kernels.options import KernelOptions

        names = ", ".join(f.name for f in dataclasses.fields(KernelOptions))
        ap.add_argument("--kernel-option", action="append", default=[], metavar="NAME=0|1",
                        help=f"an A/B switch of the fused kernels' default configs (wide.kernels.KernelOptions: "
                             f"{names}), e.g. skinny_swap=0; repeatable")
    return ap


def setup(args: argparse.Namespace, seed: int = 0) -> tuple[torch.device, torch.dtype]:
    """Checks the common flags and the routing ones (`add_routing_args`), exiting with one line naming the bad one,
    and seeds torch."""
    name = sys.argv[0].rsplit("/", 1)[-1] or "benchmark"
    dev = torch.device(getattr(args, "device", "cuda"))
    if dev.type not in ("cuda", "cpu"):
        raise SystemExit(f"{name}: --device must be cuda or cpu, got {args.device!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"{name}: --device cuda, but this machine has no CUDA GPU (try --device cpu where the "
                         "script supports it)")
    if getattr(args, "layers", None) is not None and args.layers < 1:
        raise SystemExit(f"{name}: --layers must be at least 1, got {args.layers}")
    if getattr(args, "kernel_option", None):
        kernel_options_of(args)  # a bad item fails here, before any compute
    if hasattr(args, "ffn_group_size"):
        check_routing_args(args)
    torch.manual_seed(seed)
    return dev, DTYPES[getattr(args, "dtype", "bf16")]


def kernel_options_of(args: argparse.Namespace):
    """``--kernel-option`` items as `wide.kernels.KernelOptions` (one error naming the flag on a bad item)."""
    from wide.kernels import KernelOptions

    try:
        return KernelOptions.parse(getattr(args, "kernel_option", []) or [])
    except ValueError as err:
        raise SystemExit(f"{sys.argv[0].rsplit('/', 1)[-1]}: {err}") from None


def shape_config(shape: str, layers: Optional[int] = None):
    """The transformers config of a `SHAPES` preset (``layers``: the first N decoder layers), SDPA attention."""
    import transformers

    cls, fields = SHAPES[shape]
    cfg = getattr(transformers, cls)(**{**fields(), **({"num_hidden_layers": layers} if layers else {})})
    cfg._attn_implementation = "sdpa"
    return cfg


def random_model(shape: str, layers: Optional[int], device, dtype: torch.dtype):
    """A `SHAPES` preset with random weights (seeded by `setup`), built on ``device``, in eval mode."""
    from transformers import AutoModelForCausalLM

    with torch.device(device):
        model = AutoModelForCausalLM.from_config(shape_config(shape, layers), dtype=dtype)
    return model.eval()


def load_model(model: Optional[str], shape: str, layers: Optional[int], device, dtype: torch.dtype):
    """A local model / asset (``model``, through `wide.bench.models.build_model`) or the ``shape`` preset."""
    if model:
        from wide.bench.models import build_model

        return build_model(model, layers, str(device), dtype)
    return random_model(shape, layers, device, dtype)


def add_routing_args(ap: argparse.ArgumentParser, sparsity: float = 0.5, router: str = "random") -> None:
    """The routed side's flags, with `wide bench`'s defaults (a profile must time what the bench times)."""
    ap.add_argument("--sparsity", type=float, default=sparsity, help="target sparsity of the routed side")
    ap.add_argument("--router", choices=["random", "lowrank"], default=router,
                    help="as `wide bench --router` (lowrank: untrained low-rank routers calibrated to the rate)")
    ap.add_argument("--ffn-group-size", type=int, default=128, help="as `wide bench` (WideConfig's default is 64)")
    ap.add_argument("--attn-group-size", type=int, default=None)


def check_routing_args(args: argparse.Namespace) -> None:
    """One error naming the flag for a routing value the model could not take."""
    name = sys.argv[0].rsplit("/", 1)[-1] or "benchmark"
    if not 0 <= args.sparsity < 1:
        raise SystemExit(f"{name}: --sparsity must be in [0, 1), got {args.sparsity}")
    if args.ffn_group_size < 1 or (args.attn_group_size is not None and args.attn_group_size < 1):
        raise SystemExit(f"{name}: --ffn-group-size / --attn-group-size must be positive")


def route(model, sparsity: float, router: str = "random", ffn_group_size: int = 128,
          attn_group_size: Optional[int] = None, backend: Optional[str] = None, fuse_glue: bool = False,
          coherent: bool = False):
    """The bench's routed side, in place: ``apply_wide`` with synthetic routers at ``sparsity``, eval mode, routed
    forwards through ``wide.kernels`` (``backend``: its default choice), then (optionally) the glue compiled again
    around the routed modules (``wide.fuse_glue``) and batch-coherent decode."""
    import wide
    from wide.bench.synthetic import set_synthetic_rate
    from wide.modeling.inference import enable_kernels

    wide.apply_wide(model, wide.WideConfig(sparsity=sparsity, router=router, ffn_group_size=ffn_group_size,
                                           attn_group_size=attn_group_size))
    model.eval()
    enable_kernels(model, backend)
    if fuse_glue:
        wide.fuse_glue(model)
    set_synthetic_rate(model, router, sparsity)
    if coherent:
        wide.set_coherent_decode(model, 1)
    return model


# --------------------------------------------------------------------------------------------------
# timers (milliseconds)
# --------------------------------------------------------------------------------------------------


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def wall_ms(fn: Callable[[], object], reps: int, warmup: int = 1) -> float:
    """Median host-clock ms of one call (synchronized before and after): for whole requests with host work."""
    def once() -> float:
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        return (time.perf_counter() - t0) * 1e3

    for _ in range(warmup):
        once()  # kernels compile, graphs capture
    return statistics.median(once() for _ in range(reps))


def event_ms(fn: Callable[[], object], iters: int, warmup: int = 2) -> float:
    """Mean ms per call of ``iters`` back-to-back eager calls between two CUDA events (host clock on CPU)."""
    for _ in range(warmup):
        fn()
    if not torch.cuda.is_available():
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t0) * 1e3 / iters
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def bench_ms(fn: Callable[[], object], rep_ms: float = 200.0) -> float:
    """Median ms of ``triton.testing.do_bench`` (L2 flushed between calls): large ops."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=rep_ms, return_mode="median"))


def graph_ms(fns, inner: int = 20, reps: int = 30) -> float:
    """Median ms per call of a CUDA graph replayed ``reps`` times: small ops, whose launch would dominate eager.

    ``fns``: one callable, captured ``inner`` times back to back, or a list of callables, each captured once (e.g.
    one per weight copy, so that L2 does not hold the weights across calls).
    """
    calls = list(fns) if isinstance(fns, (list, tuple)) else [fns] * inner
    calls[0]()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up off the capture stream, as CUDA graphs ask
        for _ in range(2):
            for fn in calls:
                fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in calls:
            fn()
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / len(calls))
    del graph
    return statistics.median(times)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in fp32."""
    return ((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-12)).item()


# --------------------------------------------------------------------------------------------------
# config sweeps
# --------------------------------------------------------------------------------------------------


def time_candidate(results: list, config, setup_fn) -> None:
    """Appends ``(us, config label, relative error)`` of one candidate to ``results``, where ``setup_fn()`` runs it
    once and returns ``(out, ref, timer)`` (``timer()``: us a call); a candidate the shape does not take is kept as
    ``(inf, label, error message)``."""
    try:
        out, ref, timer = setup_fn()
        results.append((timer(), str(config), f"{rel_err(out, ref):.1e}"))
    except Exception as e:  # noqa: BLE001 - a candidate the shape does not take
        results.append((float("inf"), str(config), f"{type(e).__name__}: {str(e)[:80]}"))


def print_fastest(results: list, line, keep: int = 6) -> None:
    """Prints the ``keep`` fastest of ``(us, config label, error text)`` and the default (label ``"None"``) if it
    is not among them, each as ``line(us, label, err)``."""
    best = sorted(results)[:keep]
    for t, c, err in best + [r for r in results if r[1] == "None" and r not in best]:
        print(line(t, c, err), flush=True)


# --------------------------------------------------------------------------------------------------
# provenance and outputs
# --------------------------------------------------------------------------------------------------


def commit() -> str:
    """The checkout's short commit (``-dirty`` with uncommitted changes); ``BENCH_COMMIT`` where the tree is a copy
    without git (the device machine)."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             timeout=10)
        if rev.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return rev.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def meta(device=None) -> dict:
    """Where a result came from: UTC date, GPU (or CPU), library versions, commit and the exact command."""
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gpu = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    out = dict(date=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), gpu=gpu, torch=torch.__version__,
               cuda=torch.version.cuda, commit=commit(), command=" ".join(["python"] + sys.argv))
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError:
        pass
    return out


def meta_line(m: dict) -> str:
    """``meta()`` as one Markdown line (the header of a written table)."""
    return (f"_{m['date']}, {m['gpu']}, torch {m['torch']}{', triton ' + m['triton'] if 'triton' in m else ''}, "
            f"commit `{m['commit']}`; command: `{m['command']}`_")


def write_json(path: str, payload: dict, m: Optional[dict] = None) -> None:
    """``payload`` with ``meta`` (``m`` or a fresh ``meta()``) as indented JSON at ``path``."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump({"meta": m or meta(), **payload}, f, indent=1, default=str)


def report(args: argparse.Namespace, payload: dict, markdown: str, device=None) -> None:
    """Prints ``markdown`` under its provenance line and writes both to ``--md``, ``payload`` to ``--json``."""
    m = meta(device)
    text = meta_line(m) + "\n\n" + markdown.rstrip() + "\n"
    print(text, flush=True)
    if getattr(args, "md", None):
        Path(args.md).parent.mkdir(parents=True, exist_ok=True)
        Path(args.md).write_text(text)
    if getattr(args, "json", None):
        write_json(args.json, payload, m)
