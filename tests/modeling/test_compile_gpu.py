"""torch.compile (inductor) over a routed model on the triton backend, and a CUDA graph of a compiled decode
step. Run on the device: ``pytest -m gpu tests/modeling/test_compile_gpu.py``. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("coherent", [False, True], ids=["per-token", "coherent"])
def test_compiled_routed_decode_matches_eager_and_replays_from_a_graph(coherent):
    from transformers import StaticCache

    import wide
    from tests.conftest import tiny_model
    from wide.modeling.inference import enable_kernels, set_coherent_decode

    model = tiny_model("llama", num_hidden_layers=3, hidden_size=256, intermediate_size=512,
                       num_attention_heads=8, num_key_value_heads=2).to("cuda", torch.float16)
    wide.apply_wide(model, wide.WideConfig(sparsity=0.5, router="lowrank", attn_group_size=4, ffn_group_size=128))
    model.eval()
    enable_kernels(model, "triton")
    prompt = torch.arange(3, 35, device="cuda").view(2, 16)
    steps = [torch.tensor([[5 + i], [9 + i]], device="cuda") for i in range(3)]

    def run():
        set_coherent_decode(model, 1 if coherent else None)
        cache = StaticCache(config=model.config, max_cache_len=32)
        with torch.inference_mode():
            out = [model(input_ids=prompt, past_key_values=cache, use_cache=True,
                         cache_position=torch.arange(16, device="cuda")).logits]
            for i, tok in enumerate(steps):
                out.append(model(input_ids=tok, past_key_values=cache, use_cache=True,
                                 cache_position=torch.tensor([16 + i], device="cuda")).logits)
        return out, cache

    ref, _ = run()
    eager_forward = model.forward
    torch._dynamo.reset()
    try:
        model.forward = torch.compile(eager_forward)
        got, cache = run()
        for a, b in zip(ref, got):
            torch.testing.assert_close(b.float(), a.float(), rtol=2e-2, atol=2e-2)
        # the compiled step captured in a CUDA graph (after the eager warm-ups above) replays the same logits
        pos = torch.tensor([16 + len(steps)], device="cuda")
        tok = torch.tensor([[11], [13]], device="cuda")
        with torch.inference_mode():
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                expect = model(input_ids=tok, past_key_values=cache, use_cache=True, cache_position=pos).logits.clone()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static = model(input_ids=tok, past_key_values=cache, use_cache=True, cache_position=pos).logits
            graph.replay()
            torch.cuda.synchronize()
        if not coherent:  # a coherent step moves its EMA memory, so the replayed step may select other groups
            torch.testing.assert_close(static.float(), expect.float(), rtol=2e-2, atol=2e-2)
        assert torch.isfinite(static).all()
    finally:
        model.forward = eager_forward
        torch._dynamo.reset()
