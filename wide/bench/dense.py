"""The dense decode baseline: the fastest of transformers' masked SDPA and unmasked SDPA over exactly the filled
keys of the cache, with each SDPA backend forced in turn, (``--dense-compile``) the fastest of those with the
whole step under ``torch.compile``, and (with a fused decode option on, `fused_dense_decode`) the routed model's own
dense step with the same fused launches."""

from __future__ import annotations

import contextlib
import warnings
from typing import Optional

import torch

from wide.bench.runners import DecodeRunner

SLICED = "wide_bench_sliced_sdpa"
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")
"""Inductor modes ``--dense-compile`` takes (the bench captures the step's CUDA graph itself)."""
_slice_len: list[Optional[int]] = [None]


def _sliced_sdpa(module, query, key, value, attention_mask, scaling=None, **kwargs):
    """Dense decode attention over exactly the filled part of a static cache (bench only).

    The context is fixed while timing, so the keys a decode step may see are known on the host: the
    step attends to ``key[:, :, :n]`` with no mask, letting sdpa pick its fastest kernel (flash, cuDNN,
    memory-efficient) with native GQA, instead of a masked pass over the whole cache.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    n = _slice_len[0]
    if n is None or query.shape[2] != 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key[:, :, :n], value[:, :, :n], scale=scaling, enable_gqa=key.shape[1] != query.shape[1])
    return out.transpose(1, 2).contiguous(), None


def dense_decode_variants(graphs: bool):
    """``(name, attention implementation, context manager)`` for every dense decode attention to try.

    With CUDA graphs (static cache) the HF default runs a masked sdpa over the whole cache; the
    sliced variants read only the filled part, with each sdpa backend forced in turn. The fastest one
    is the dense baseline (the strongest we have, with the same graph overheads removed).
    """
    out = [("hf-sdpa", "sdpa", contextlib.nullcontext)]
    if graphs and torch.cuda.is_available():
        from torch.nn.attention import SDPBackend, sdpa_kernel

        for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                              ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
            out.append((f"sliced-{name}", SLICED, lambda b=backend: sdpa_kernel([b])))
    return out


def _register_sliced() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(SLICED, _sliced_sdpa)
    AttentionMaskInterface.register(SLICED, ALL_MASK_ATTENTION_FUNCTIONS._global_mapping["sdpa"])


@contextlib.contextmanager
def use_attention(model, impl: str, keys: Optional[int] = None):
    """Run ``model`` with the attention implementation ``impl`` inside the block, then restore its own.

    With ``impl == SLICED`` a decode step attends to exactly the first ``keys`` slots of the cache (a fixed count:
    the bench's prompt and its first decode token; the `DecodeRunner`'s later tokens read no more keys, which
    favours the dense side by at most the pool's 15 further keys).
    """
    if impl == SLICED:
        _register_sliced()
    base = model.config._attn_implementation
    model.config._attn_implementation = impl
    _slice_len[0] = keys if impl == SLICED else None
    try:
        yield
    finally:
        model.config._attn_implementation = base
        _slice_len[0] = None


def compile_options(spec: str) -> dict:
    """``torch.compile`` keyword arguments of ``--dense-compile SPEC``: an inductor mode (`COMPILE_MODES`) or the
    name of another dynamo backend (``aot_eager``, ...); modes that capture CUDA graphs of their own are refused."""
    if spec in ("reduce-overhead", "max-autotune"):
        raise ValueError(f"--dense-compile: mode {spec!r} captures CUDA graphs of its own and the bench captures the "
                         f"step itself: take one of {', '.join(COMPILE_MODES)} or a backend name")
    return {"backend": "inductor", "mode": spec} if spec in COMPILE_MODES else {"backend": spec}


def best_dense_decode(model, batch: int, context: int, graphs: bool, iters: int,
                      compile_spec: Optional[str] = None) -> tuple[float, str, dict]:
    """Median ms of the fastest dense decode variant, its name, and every variant's time (``inf``: it failed).

    With ``compile_spec`` (``--dense-compile``'s value) the fastest attention variant is timed once more with the
    whole decode step (the model's forward over the static cache) under ``torch.compile``, inside the same CUDA
    graph; a variant that fails to compile or capture is skipped (its name says why).
    """
    times: dict[str, float] = {}
    specs = {}
    for name, impl, ctx in dense_decode_variants(graphs):
        key, ms = _time_variant(model, batch, context, graphs, iters, name, impl, ctx)
        times[key], specs[key] = ms, (name, impl, ctx)
    if compile_spec is not None:
        name, impl, ctx = specs[min(times, key=times.get)]
        key, ms = _time_variant(model, batch, context, graphs, iters, f"compiled {name}", impl, ctx, compile_spec)
        times[key] = ms
    best = min(times, key=times.get)
    return times[best], best, times


def _time_variant(model, batch, context, graphs, iters, name, impl, ctx, compile_spec=None) -> tuple[str, float]:
    with use_attention(model, impl, keys=context + 1):
        try:
            with warnings.catch_warnings():  # a forced sdpa backend explains every refusal; the table says it
                warnings.filterwarnings("ignore", category=UserWarning, message=".*(kernel not used|fused kernels|"
                                        "has been runtime disabled)")
                step_fn = None
                if compile_spec is not None:
                    from wide.bench.models import raise_recompile_limits

                    raise_recompile_limits()
                    step_fn = torch.compile(model, dynamic=False, **compile_options(compile_spec))
                # a compiled step that cannot be captured is not timed eagerly: it would recompile for the
                # dynamic cache and lose to the graph variants anyway
                runner = DecodeRunner(model, batch, context, graphs, attn_ctx=ctx, step_fn=step_fn,
                                      fallback=compile_spec is None)
                key, ms = f"{name} ({runner.mode.split(' ')[0]})", runner.time(warmup=3, iters=iters)
            del runner
        except Exception as err:  # noqa: BLE001 - a backend that does not take this shape, a failed compile
            why = type(err).__name__
            if compile_spec is not None:  # the one line the report prints for a skipped compiled variant
                why += ": " + (str(err).strip().splitlines() or [""])[0][:100]
            key, ms = f"{name} (failed: {why})", float("inf")
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return key, ms


def fused_dense_decode(model, batch: int, context: int, graphs: bool, iters: int, best: str) -> tuple[str, float]:
    """(name, median ms) of the routed ``model``'s dense step: routing off (`WideRuntime.routing_off`: no router, every
    head and channel) through the fused decode launches the current `KernelOptions` switch on (`decode_qkv` computing
    every q head, `decode_residual`'s adds inside cuBLAS), over the attention variant ``best`` (the plain dense
    winner's name). A dense baseline with the same launch savings as the routed step: without it, part of a routed
    ratio would be fusion any dense model could have."""
    from wide.modeling.wrap import runtime_of

    name = best.split(" (")[0].removeprefix("compiled ")
    found = [(n, impl, ctx) for n, impl, ctx in dense_decode_variants(graphs) if n == name]
    if not found:
        return f"wide-fused {name} (failed: no such variant)", float("inf")
    _, impl, ctx = found[0]
    with runtime_of(model).routing_off():
        return _time_variant(model, batch, context, graphs, iters, f"wide-fused {name}", impl, ctx)
