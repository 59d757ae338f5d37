"""Timing runners: a batch-1 prefill (eager or CUDA graph), a chunked prefill through `wide.Generator`, and decode
steps after a fixed prompt (CUDA graph over a static cache, or eager steps over a dynamic cache)."""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Callable, Optional

import torch

from wide.bench.models import DECODE_TOKENS, bench_ids, decode_ids
from wide.modeling.generate import cache_kwarg


def timed(fn: Callable[[], object], *, warmup: int = 2, iters: int = 5) -> float:
    """Median milliseconds of ``fn`` (CUDA events on GPU, wall clock otherwise)."""
    for _ in range(warmup):
        fn()
    cuda = torch.cuda.is_available() and torch.cuda.current_device() is not None
    out = []
    for _ in range(iters):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t) * 1e3)
    return statistics.median(out)


@contextlib.contextmanager
def _untraced_masks():
    """Keep SDPA's ``is_causal`` path in a captured prefill.

    Without a cache and an attention mask, transformers looks for packed sequences in the position ids;
    the check reads a tensor on the host, so under stream capture (which it treats as tracing) it assumes
    packing and builds the full causal mask — SDPA can then no longer pick flash (dense: 944 vs 583 ms eager
    at 16k on the H200). The bench's prompt is one unpacked sequence per row, so the check's eager answer
    ("not packed") holds for every replay of the fixed-shape graph: give it without the host read.
    """
    try:
        from transformers import masking_utils
    except ImportError:  # pragma: no cover - transformers always has it from 4.53 on
        yield
        return
    real_packed = getattr(masking_utils, "find_packed_sequence_indices", None)
    real_tracing = getattr(masking_utils, "is_tracing", None)
    if real_packed is not None:
        masking_utils.find_packed_sequence_indices = lambda position_ids: None
    if real_tracing is not None:  # transformers 5.17 asks is_tracing(None) (no padding mask): nothing to read
        masking_utils.is_tracing = lambda t=None, *a, **k: False if t is None else real_tracing(t, *a, **k)
    try:
        yield
    finally:
        if real_packed is not None:
            masking_utils.find_packed_sequence_indices = real_packed
        if real_tracing is not None:
            masking_utils.is_tracing = real_tracing


class PrefillRunner:
    """Times one batch-1 prefill (logits of the last token only), eagerly or replayed from a CUDA graph.

    The graph mode removes host launch overhead on both sides (what an engine that captures prefill
    shapes gets); a capture that fails falls back to eager and says why in ``mode``.
    """

    def __init__(self, model, tokens: int, graph: bool):
        self.model = model
        dev = next(model.parameters()).device
        self.ids = bench_ids(model, (1, tokens), device=dev)
        self.graph = None
        self.mode = "eager"
        if graph and dev.type == "cuda":
            try:
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                # warm-ups under the capture's own mask context: a compiled forward then needs no recompile
                # (its guards see the same transformers functions) while capturing
                with torch.cuda.stream(stream), _untraced_masks():
                    for _ in range(2):  # compiles the Triton kernels and fills the allocator before capture
                        self._forward()
                torch.cuda.current_stream().wait_stream(stream)
                graph_ = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph_), _untraced_masks():
                    self._forward()
                self.graph, self.mode = graph_, "graph"
            except Exception as err:  # noqa: BLE001 - report and fall back
                self.mode = f"eager (graph capture failed: {type(err).__name__}: {str(err)[:80]})"

    def _forward(self):
        with torch.inference_mode():
            self.model(input_ids=self.ids, logits_to_keep=1, use_cache=False)

    def step(self):
        if self.graph is not None:
            self.graph.replay()
        else:
            self._forward()


class ChunkedPrefillRunner:
    """Times one batch-1 prompt through `wide.Generator`'s chunked prefill: the prompt cut into ``chunk``-token
    pieces over a static cache, each replayed from one captured graph (what a serving loop that keeps its graphs
    across requests gets: no per-prompt capture, any prompt length). The first step captures; the mode says
    ``eager`` when the capture failed (the Generator warns why)."""

    def __init__(self, model, tokens: int, chunk: int):
        import wide

        dev = next(model.parameters()).device
        self.ids = bench_ids(model, (1, tokens), device=dev)
        self.gen = wide.Generator(model, batch_size=1, max_cache_len=-(-tokens // chunk) * chunk, chunk=chunk,
                                  whole_from=None, graphs=dev.type == "cuda")
        self.step()  # the first call captures the chunk's graph
        self.mode = f"chunks of {chunk}, " + ("graph" if self.gen._chunks[chunk].graph is not None else "eager")

    def step(self):
        with torch.inference_mode():
            self.gen._prefill(self.ids)


class DecodeRunner:
    """Times decode steps after a fixed ``context``-token prompt, under a CUDA graph if capturable, else eagerly.

    One :meth:`step` decodes the ``K`` tokens of `decode_ids` in sequence, as generation does: token ``i`` at
    position ``context + i``, with tokens ``0 .. i-1`` in the cache; the next :meth:`step` starts again at
    ``context``. (Until 2026-12-04 every token was fed at position ``context`` right after the prompt, without the
    tokens before it: a text with holes, on which issue 22's Qwen routers skipped 36% by weight against the 48% of
    the same tokens in sequence, so trained-router rows were timed at a rate below the model's.)

    ``step_fn`` runs the decode steps in place of the model (e.g. a ``torch.compile`` of it; the prompt's prefill
    stays the model's own); with ``fallback=False`` a failed capture raises instead of timing eager steps.
    ``tokens``: how many text tokens a row decodes (`decode_ids`; random ids: one).
    """

    def __init__(self, model, batch: int, context: int, graphs: bool, attn_ctx: Callable = contextlib.nullcontext,
                 step_fn: Optional[Callable] = None, fallback: bool = True, tokens: int = DECODE_TOKENS):
        self.model, self.batch, self.context = model, batch, context
        self.attn_ctx = attn_ctx
        self.step_fn = step_fn if step_fn is not None else model
        dev = next(model.parameters()).device
        self.pool = decode_ids(self.model, batch, context, dev, tokens)  # [K, B, 1]: the tokens the steps decode in turn
        self.ids = self.pool[0].clone()  # the static input buffer a captured step reads
        # the steps' positions, and the static buffer a captured step reads its position from
        self.positions = context + torch.arange(self.pool.shape[0], device=dev)
        self.pos = self.positions[:1].clone()
        self.mode = "eager"
        self.graph = None
        if graphs and dev.type == "cuda":
            try:
                self._capture(dev)
                self.mode = "graph"
            except Exception as err:  # noqa: BLE001 - report and fall back
                if not fallback:
                    raise
                self.mode = f"eager (graph capture failed: {type(err).__name__}: {str(err)[:80]})"
                self.graph = None
        if self.graph is None:
            self._prefill_dynamic(dev)

    def _prefill_dynamic(self, dev):
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)
        prompt = bench_ids(self.model, (self.batch, self.context), device=dev)
        with torch.inference_mode():
            self.model(input_ids=prompt, **{cache_kwarg(self.model): self.cache}, use_cache=True, logits_to_keep=1)

    def _capture(self, dev):
        from transformers import StaticCache

        cache = StaticCache(config=self.model.config, max_cache_len=self.context + self.tokens + 8)
        prompt = bench_ids(self.model, (self.batch, self.context), device=dev)
        with torch.inference_mode():
            self.model(input_ids=prompt, **{cache_kwarg(self.model): cache}, use_cache=True, logits_to_keep=1,
                       cache_position=torch.arange(self.context, device=dev))
            seek = static_seek(cache, self.pos)

            def decode_step():
                seek()  # this step's token writes at its own position (the graph reads ``pos`` at each replay)
                self.step_fn(input_ids=self.ids, **{cache_kwarg(self.model): cache}, use_cache=True,
                             cache_position=self.pos)

            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream), self.attn_ctx():
                for _ in range(3):  # compiles the Triton kernels and fills the allocator before capture
                    decode_step()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph), self.attn_ctx():
                decode_step()
        self.cache, self.graph = cache, graph

    @property
    def tokens(self) -> int:
        """Decode steps one :meth:`step` call runs (the tokens of ``pool``)."""
        return self.pool.shape[0]

    def _one(self, i: int) -> None:
        if self.tokens > 1:
            self.ids.copy_(self.pool[i])  # two tiny copies a step, on both sides of a ratio
            self.pos.copy_(self.positions[i:i + 1])
        if self.graph is not None:
            self.graph.replay()
            return
        with torch.inference_mode(), self.attn_ctx():
            self.step_fn(input_ids=self.ids, **{cache_kwarg(self.model): self.cache}, use_cache=True)
            if i == self.tokens - 1:
                self.cache.crop(-self.tokens)  # back to the prompt: the next step() decodes the same tokens

    def step(self):
        """The ``pool``'s tokens decoded in sequence after the prompt (one decode step each)."""
        for i in range(self.tokens):
            self._one(i)

    def time(self, warmup: int = 3, iters: int = 20) -> float:
        """Median milliseconds per decode step (of ``iters`` timed :meth:`step` calls, each over ``tokens`` steps)."""
        return timed(self.step, warmup=warmup, iters=iters) / self.tokens

    def average(self, read: Callable[[], dict]) -> dict:
        """The mean over ``pool``'s tokens of ``read()`` (numbers, or dicts of numbers) taken after each one's step."""
        rows = []
        for i in range(self.tokens):
            self._one(i)
            rows.append(read())
        return _mean(rows)


def _mean(rows: list):
    first = rows[0]
    if isinstance(first, dict):
        return {k: _mean([r[k] for r in rows]) for k in first}
    if isinstance(first, (int, float)) and not isinstance(first, bool):
        return sum(rows) / len(rows)
    return first


def static_rewind(cache, length: int) -> Callable[[], None]:
    """A function that sets a static cache's write position back to ``length`` with device ops only.

    transformers >= 5 static layers keep their own ``cumulative_length`` device counter and advance it
    on every update (older ones write at the ``cache_position`` given): a captured decode step that
    did not rewind it would write one slot further on each replay and run off the cache's end.
    """
    counters = [layer.cumulative_length for layer in getattr(cache, "layers", [])
                if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor)]

    def rewind() -> None:
        for c in counters:
            c.fill_(length)
    rewind()
    return rewind


def static_seek(cache, position: torch.Tensor) -> Callable[[], None]:
    """A function that sets a static cache's write position to the one-element device tensor ``position``, read
    when it runs (device ops only: a captured call follows later changes of ``position``). transformers >= 5 static
    layers write at their own ``cumulative_length`` counter, not at the ``cache_position`` given (`static_rewind`)."""
    counters = [layer.cumulative_length for layer in getattr(cache, "layers", [])
                if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor)]

    def seek() -> None:
        for c in counters:
            c.copy_(position.reshape(()))
    seek()
    return seek
