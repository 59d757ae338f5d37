"""torch.compile over a routed model with kernels on: the routed ops are eager graph breaks, the glue compiles.

CPU (torch backend, aot_eager) in CI; GPU (triton backend, inductor, a CUDA graph of a compiled decode step)
on the device: ``pytest -m gpu tests/modeling/test_compile.py``.
"""

from __future__ import annotations

import pytest
import torch
from transformers import StaticCache

import wide
from tests.conftest import tiny_model
from tests.modeling.graph_step import eager_and_replayed_step
from wide.modeling.inference import enable_kernels, set_coherent_decode

def _routed(device: str, dtype: torch.dtype, backend: str, attn_group: int, ffn_group: int, **sizes):
    model = tiny_model("llama", **sizes).to(device, dtype)
    wide.apply_wide(model, wide.WideConfig(sparsity=0.5, router="lowrank", attn_group_size=attn_group,
                                           ffn_group_size=ffn_group))
    model.eval()
    enable_kernels(model, backend)
    return model


def _prefill_and_decode(model, rows: int, coherent: bool):
    """Logits of an 8-token prefill and three decode steps over a static cache (and the cache)."""
    dev = next(model.parameters()).device
    set_coherent_decode(model, 1 if coherent else None)
    cache = StaticCache(config=model.config, max_cache_len=32)
    prompt = torch.arange(3, 3 + 8 * rows, device=dev).view(rows, 8)
    with torch.inference_mode():
        out = [model(input_ids=prompt, past_key_values=cache, use_cache=True,
                     cache_position=torch.arange(8, device=dev)).logits]
        for i in range(3):
            tok = torch.arange(5 + i, 5 + i + rows, device=dev).view(rows, 1)
            out.append(model(input_ids=tok, past_key_values=cache, use_cache=True,
                             cache_position=torch.tensor([8 + i], device=dev)).logits)
    return out, cache


@pytest.mark.parametrize("coherent", [False, True], ids=["per-token", "coherent"])
def test_compiled_routed_model_matches_eager_and_only_breaks_at_routed_ops(coherent):
    """Same logits (prefill and static-cache decode), and every graph break is one of the routed ops / plans /
    the routers' host-side caches (eager by design)."""
    model = _routed("cpu", torch.float32, "torch", 2, 32, num_hidden_layers=2)
    ref, _ = _prefill_and_decode(model, 2, coherent)
    eager_forward = model.forward
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    try:
        model.forward = torch.compile(eager_forward, backend="aot_eager")
        got, _ = _prefill_and_decode(model, 2, coherent)
        breaks = dict(torch._dynamo.utils.counters["graph_break"])
    finally:
        model.forward = eager_forward
        torch._dynamo.reset()
    for a, b in zip(ref, got):
        torch.testing.assert_close(b, a)
    assert breaks and all("torch.compiler.disable" in reason for reason in breaks), list(breaks)


@pytest.mark.parametrize("coherent", [False, True], ids=["per-token", "coherent"])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_inductor_compiled_routed_decode_matches_eager_and_replays_from_a_graph(coherent):
    """Triton backend, inductor: same logits as eager; the compiled step captured in a CUDA graph (after the
    eager warm-ups) replays the same logits."""
    model = _routed("cuda", torch.float16, "triton", 4, 128, num_hidden_layers=3, hidden_size=256,
                    intermediate_size=512, num_attention_heads=8, num_key_value_heads=2)
    ref, _ = _prefill_and_decode(model, 2, coherent)
    eager_forward = model.forward
    torch._dynamo.reset()
    try:
        model.forward = torch.compile(eager_forward)
        got, cache = _prefill_and_decode(model, 2, coherent)
        for a, b in zip(ref, got):
            torch.testing.assert_close(b.float(), a.float(), rtol=2e-2, atol=2e-2)
        with torch.inference_mode():
            expect, static = eager_and_replayed_step(model, cache, torch.tensor([[11], [13]], device="cuda"), 11)
        # the replay rewrites the same cache slot with the same token; coherent decode keeps no memory by default
        torch.testing.assert_close(static.float(), expect.float(), rtol=2e-2, atol=2e-2)
    finally:
        model.forward = eager_forward
        torch._dynamo.reset()
