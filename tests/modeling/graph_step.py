"""One decode step, eager and replayed from a CUDA graph, for the GPU tests of compiled / fused models."""

from __future__ import annotations

import torch

from wide.bench.runners import static_rewind


def eager_and_replayed_step(model, cache, tok: torch.Tensor, pos: int, warmups: int = 1):
    """(eager logits, logits of one CUDA-graph replay) of the decode step ``tok`` at cache slot ``pos``.

    Static cache layers count their own write position, so every call is rewound to write slot ``pos`` again:
    the warm-ups (on a side stream, as capture needs) and the replay all rewrite the same slot with the same token.
    Call under ``torch.inference_mode()``.
    """
    position = torch.tensor([pos], device=tok.device)
    rewind = static_rewind(cache, pos)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmups):
            expect = model(input_ids=tok, past_key_values=cache, use_cache=True, cache_position=position).logits.clone()
            rewind()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = model(input_ids=tok, past_key_values=cache, use_cache=True, cache_position=position).logits
        rewind()
    graph.replay()
    torch.cuda.synchronize()
    return expect, static
