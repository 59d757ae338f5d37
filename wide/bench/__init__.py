"""``wide bench``: end-to-end prefill latency and decode throughput, dense vs routed, in one run.

Default model: a Llama-3.1-8B-shaped network (hidden 4096, FFN 14336, 32 q / 8 kv heads, 32 layers)
with random bf16 weights; or ``--model`` for any local model / asset. Masks come from a trained
checkpoint (``--checkpoint``) or are synthetic (``random`` routers at each ``--sparsity``).

Prefill: batch 1, logits for the last token only, timed eagerly on both sides and (on a GPU, unless
``--no-graphs``) replayed from a CUDA graph on both sides, which removes host launch overhead the way an
engine that captures prefill shapes does. Decode: one new token per row after a ``--context``
prompt. Decode runs under CUDA graphs on both sides when they can be captured (one step over a static
cache, rewound on the device after each replay; the routed side runs the fused decode attention with
per-row lengths read from the mask). The dense decode baseline is the fastest of transformers' masked
SDPA and unmasked SDPA over the filled keys with each backend forced (``--dense-compile``: and the fastest of those
with the whole step under ``torch.compile``). ``--no-graphs`` or a failed capture falls back to eager steps with a
dynamic cache on both sides. Every row prints both absolute times and dense/routed; decode rows add each side's
bandwidth floor, the bytes its step must read over the device bandwidth measured at the start (`floor`).

Modules: `models` (what is timed), `runners` (eager / CUDA-graph prefill, chunked prefill, decode step),
`dense` (the dense decode baselines), `floor` (the bytes a decode step reads, the device bandwidth), `synthetic`
(synthetic routers at a rate), `latency` (the rows), `quality` (``--quality``: decode-time perplexity of per-token vs coherent routing), `report` (tables, JSON),
`cli` (``wide bench``).
"""

from wide.bench.cli import bench_main

__all__ = ["bench_main"]
