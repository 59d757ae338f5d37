"""The dense decode baseline: the fastest of transformers' masked SDPA and unmasked SDPA over exactly the filled
keys of the cache, with each SDPA backend forced in turn."""

from __future__ import annotations

import contextlib
import warnings
from typing import Optional

import torch

from wide.bench.runners import DecodeRunner, timed

SLICED = "wide_bench_sliced_sdpa"
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

    With ``impl == SLICED`` a decode step attends to exactly the first ``keys`` slots of the cache (the filled ones
    at the bench's fixed context).
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


def best_dense_decode(model, batch: int, context: int, graphs: bool, iters: int) -> tuple[float, str, dict]:
    """Median ms of the fastest dense decode variant, its name, and every variant's time."""
    times: dict[str, float] = {}
    for name, impl, ctx in dense_decode_variants(graphs):
        with use_attention(model, impl, keys=context + 1):
            try:
                with warnings.catch_warnings():  # a forced sdpa backend explains every refusal; the table says it
                    warnings.filterwarnings("ignore", category=UserWarning, message=".*(kernel not used|fused kernels|"
                                            "has been runtime disabled)")
                    runner = DecodeRunner(model, batch, context, graphs, attn_ctx=ctx)
                    times[f"{name} ({runner.mode.split(' ')[0]})"] = timed(runner.step, warmup=3, iters=iters)
                del runner
            except Exception as err:  # noqa: BLE001 - a backend that does not take this shape
                times[f"{name} (failed: {type(err).__name__})"] = float("inf")
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    best = min(times, key=times.get)
    return times[best], best, times
