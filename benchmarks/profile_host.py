"""Where an eager routed forward spends its *host* time: inclusive time per layer of each piece, dense vs routed.

Eager prefill is host-bound when the host issues a layer's launches slower than the GPU runs them (a 1k prefill
of the Llama-3.1-8B shape on the H200, or 4k with trained routers: BENCHMARKS.md). This wraps the pieces of a
decoder layer (HF's layer and attention module, the routers' hooks, the routed linears and MLP, each public
routed op, every Triton JIT launch) in perf_counter timers and prints their inclusive host time per layer over
``--iters`` forwards of ``--tokens`` tokens. While timing, the GPU is first put to sleep (``torch.cuda._sleep``)
so that the calls only queue: what is measured is host work, not waiting for the GPU. ``--ops`` adds the host cost
of one call of each routed op through the public API and through the backend directly (the dispatch's share).

    PYTHONPATH=. python3 benchmarks/profile_host.py --router lowrank --tokens 1024
    PYTHONPATH=. python3 benchmarks/profile_host.py --ops
"""

from __future__ import annotations

import functools
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import common  # noqa: E402

SLEEP_CYCLES = 300_000_000  # ~0.15 s on an H200: longer than the host needs to queue an 8-layer forward


class Timers:
    """Inclusive perf_counter totals of wrapped callables, recorded only while ``on``."""

    def __init__(self) -> None:
        self.total: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.on = False

    def wrap(self, name: str, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            if not self.on:
                return fn(*args, **kwargs)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.total[name] += time.perf_counter() - t0
                self.calls[name] += 1
        return timed

    def patch(self, owner, attr: str, name: str) -> None:
        setattr(owner, attr, self.wrap(name, getattr(owner, attr)))

    def table(self, per: str) -> list[str]:
        n = max(1, self.calls.get(per, 0))
        return [f"  {self.total[k] / n * 1e6:8.1f} us/layer  {self.calls[k] / n:5.2f} calls/layer  {k}"
                for k in sorted(self.total)]


def install(timers: Timers) -> None:
    """Wrap the pieces (before ``apply_wide``, which binds the route hooks). Compiled glue (``fuse_glue``) is
    left alone: a timer inside a compiled region would be traced."""
    import triton
    from transformers.models.llama import modeling_llama as ml

    import wide.kernels as kernels
    import wide.modeling.wrap as wrap
    import wide.routers.lowrank as lowrank
    from wide.modeling.inference import EarlyLinear, RoutedLinear, RoutedMLP
    from wide.modeling.layer import WideLayer

    timers.patch(ml.LlamaDecoderLayer, "forward", "A decoder layer (all)")
    timers.patch(ml.LlamaAttention, "forward", "B  attention module")
    timers.patch(RoutedMLP, "forward", "C  routed MLP module")
    timers.patch(wrap, "_route_hook", "D  routers (route hooks)")
    timers.patch(WideLayer, "kernel_mask", "E  kernel_mask (plan)")
    timers.patch(RoutedLinear, "forward", "F  RoutedLinear q / o")
    timers.patch(EarlyLinear, "forward", "G  EarlyLinear k / v")
    for op in ("gemm_mn", "swiglu", "gemm_k", "attention_prefill"):
        timers.patch(kernels, op, f"H  wide.kernels.{op}")
    timers.patch(lowrank, "router_margin", "H  wide.kernels.router_margin")
    timers.patch(triton.runtime.jit.JITFunction, "run", "I  Triton JIT launches")


def layer_table(args, device, dtype) -> None:
    import wide
    from wide.bench.models import random_ids

    router, tokens, layers, iters = args.router, args.tokens, args.layers, args.iters
    timers = Timers()
    install(timers)
    model = common.random_model(args.shape, layers, device, dtype)
    wide.fuse_glue(model)
    ids = random_ids(model, (1, tokens), device)

    def forward():
        with torch.inference_mode():
            model(input_ids=ids, logits_to_keep=1, use_cache=False)

    for side in ("dense", "routed"):
        if side == "routed":
            common.route(model, args.sparsity, router, args.ffn_group_size, args.attn_group_size, fuse_glue=True)
        for _ in range(4):
            forward()
        torch.cuda.synchronize()
        timers.total.clear()
        timers.calls.clear()
        timers.on = True
        for _ in range(iters):
            torch.cuda.synchronize()
            torch.cuda._sleep(SLEEP_CYCLES)
            forward()
            torch.cuda.synchronize()
        timers.on = False
        print(f"\n{side} ({router} routers at {args.sparsity:.0%} on the routed side), T={tokens}, {layers} layers, "
              f"host time per layer (inclusive, mean of {iters} forwards)")
        print("\n".join(timers.table("A decoder layer (all)")))


def ops_table(tokens: int) -> None:
    """Host cost of one call of each routed op (public API vs backend), ``min`` over rounds of 10 queued calls."""
    from wide import kernels
    from wide.kernels import dispatch, make_plan
    from wide.kernels.backends.base import get_backend

    dev, dt, M = "cuda", torch.bfloat16, tokens
    x = torch.randn(1, M, 4096, device=dev, dtype=dt)
    wd = torch.randn(4096, 14336, device=dev, dtype=dt)
    h = torch.randn(1, M, 14336, device=dev, dtype=dt)
    mf = torch.rand(1, M, 112, device=dev) < 0.5
    down, up = torch.randn(32, 4096, device=dev), torch.randn(112, 32, device=dev)
    b = torch.randn(112, device=dev)
    tb = get_backend("triton")
    plan = make_plan(mf, 0.5)
    plan.token_order(True)
    noop = torch.compiler.disable(lambda: None)
    cases = {
        "torch.compiler.disable'd no-op": noop,
        "dispatch.choose (gemm_k)": lambda: dispatch.choose(
            "gemm_k", None, dict(x=h, weight=wd, mask=mf, bias=None, plan=plan, out=None), h.device),
        "wide.kernels.gemm_k (down)": lambda: kernels.gemm_k(h, wd, mf, plan=plan, x_masked=True),
        "backend gemm_k (down)": lambda: tb.gemm_k(h, wd, mf, plan=plan, x_masked=True),
        "wide.kernels.router_margin": lambda: kernels.router_margin(x, down, up, b),
        "backend router_margin": lambda: tb.router_margin(x, down, up, b),
        "F.linear (cuBLAS)": lambda: torch.nn.functional.linear(x, wd.t()),
    }
    best = {k: float("inf") for k in cases}
    with torch.inference_mode():
        for fn in cases.values():
            for _ in range(3):
                fn()
        torch.cuda.synchronize()
        for _ in range(12):
            for name, fn in cases.items():
                torch.cuda.synchronize()
                torch.cuda._sleep(SLEEP_CYCLES // 6)
                t0 = time.perf_counter()
                for _ in range(10):
                    fn()
                best[name] = min(best[name], (time.perf_counter() - t0) / 10 * 1e6)
            torch.cuda.synchronize()
    print(f"\nhost us per call at {M} rows (min over 12 rounds of 10 queued calls)")
    for name, us in best.items():
        print(f"  {us:8.1f} us  {name}")


def main(argv=None) -> None:
    ap = common.parser(__doc__, device=None, shape="llama-8b", layers=8, outputs=False)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--ops", action="store_true", help="only the per-op table (at --tokens rows)")
    common.add_routing_args(ap, router="lowrank")
    args = ap.parse_args(argv)
    device, dtype = common.setup(args)
    print(common.meta_line(common.meta(device)))
    if args.ops:
        ops_table(args.tokens)
    else:
        layer_table(args, device, dtype)


if __name__ == "__main__":
    main()
