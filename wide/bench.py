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
SDPA and unmasked SDPA over the filled keys with each backend forced. ``--no-graphs`` or a failed capture
falls back to eager steps with a dynamic cache on both sides. Every row prints both absolute times and
dense/routed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
import warnings
from pathlib import Path
from typing import Callable, Optional

import torch

from wide.modeling.generate import cache_kwarg

LLAMA_8B = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                head_dim=128, num_hidden_layers=32, vocab_size=128256, max_position_embeddings=131072,
                rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False)


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


def _tokens(model, shape, device) -> torch.Tensor:
    # drawn on the CPU: a failed CUDA-graph capture (reported, then timed eagerly) can leave the CUDA
    # generator unusable, which must not stop the remaining rows
    return torch.randint(0, min(1000, model.config.vocab_size), shape).to(device)


def build_model(model: Optional[str], layers: Optional[int], device: str, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, LlamaConfig

    if model:
        from wide.assets import resolve_model

        m = AutoModelForCausalLM.from_pretrained(resolve_model(model), dtype=dtype, attn_implementation="sdpa")
        if layers:
            m.model.layers = m.model.layers[:layers]
            m.config.num_hidden_layers = layers
        return m.to(device).eval()
    cfg = LlamaConfig(**{**LLAMA_8B, **({"num_hidden_layers": layers} if layers else {})})
    cfg._attn_implementation = "sdpa"
    with torch.device(device):
        m = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return m.eval()


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
        self.ids = _tokens(model, (1, tokens), device=dev)
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
        self.ids = _tokens(model, (1, tokens), device=dev)
        self.gen = wide.Generator(model, batch_size=1, max_cache_len=-(-tokens // chunk) * chunk, chunk=chunk,
                                  whole_from=None, graphs=dev.type == "cuda")
        self.step()  # the first call captures the chunk's graph
        self.mode = f"chunks of {chunk}, " + ("graph" if self.gen._chunks[chunk].graph is not None else "eager")

    def step(self):
        with torch.inference_mode():
            self.gen._prefill(self.ids)


class DecodeRunner:
    """Times one decode step at a fixed context, under a CUDA graph if capturable, else eagerly."""

    def __init__(self, model, batch: int, context: int, graphs: bool, attn_ctx: Callable = contextlib.nullcontext):
        self.model, self.batch, self.context = model, batch, context
        self.attn_ctx = attn_ctx
        dev = next(model.parameters()).device
        self.ids = _tokens(self.model, (batch, 1), device=dev)
        self.mode = "eager"
        self.graph = None
        if graphs and dev.type == "cuda":
            try:
                self._capture(dev)
                self.mode = "graph"
            except Exception as err:  # noqa: BLE001 - report and fall back
                self.mode = f"eager (graph capture failed: {type(err).__name__}: {str(err)[:80]})"
                self.graph = None
        if self.graph is None:
            self._prefill_dynamic(dev)

    def _prefill_dynamic(self, dev):
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)
        prompt = _tokens(self.model, (self.batch, self.context), device=dev)
        with torch.inference_mode():
            self.model(input_ids=prompt, **{cache_kwarg(self.model): self.cache}, use_cache=True, logits_to_keep=1)

    def _capture(self, dev):
        from transformers import StaticCache

        cache = StaticCache(config=self.model.config, max_cache_len=self.context + 8)
        prompt = _tokens(self.model, (self.batch, self.context), device=dev)
        pos = torch.tensor([self.context], device=dev)
        with torch.inference_mode():
            self.model(input_ids=prompt, **{cache_kwarg(self.model): cache}, use_cache=True, logits_to_keep=1,
                       cache_position=torch.arange(self.context, device=dev))
            rewind = _static_rewind(cache, self.context)

            def decode_step():
                self.model(input_ids=self.ids, **{cache_kwarg(self.model): cache}, use_cache=True,
                           cache_position=pos)
                rewind()  # the next replay writes the same slot: the context stays fixed

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

    def step(self):
        if self.graph is not None:
            self.graph.replay()
            return
        with torch.inference_mode(), self.attn_ctx():
            self.model(input_ids=self.ids, **{cache_kwarg(self.model): self.cache}, use_cache=True)
            self.cache.crop(-1)  # drop the new token: the context stays fixed across timed steps


def _static_rewind(cache, length: int) -> Callable[[], None]:
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


def best_dense_decode(model, batch: int, context: int, graphs: bool, iters: int) -> tuple[float, str, dict]:
    """Median ms of the fastest dense decode variant, its name, and every variant's time."""
    _register_sliced()
    times: dict[str, float] = {}
    base = model.config._attn_implementation
    try:
        for name, impl, ctx in dense_decode_variants(graphs):
            model.config._attn_implementation = impl
            _slice_len[0] = context + 1 if impl == SLICED else None
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
    finally:
        model.config._attn_implementation = base
        _slice_len[0] = None
    best = min(times, key=times.get)
    return times[best], best, times


def compile_forward(model, backend: str) -> None:
    """``torch.compile`` the model's forward in place (both sides of the bench get the same treatment).

    The routed ops and plans are eager graph breaks (see `wide.kernels.ops`); everything between them —
    HF's RMS norms, RoPE, residual adds, the routers' small ops — is compiled. Every decoder layer and
    shape compiles its own frames, more than dynamo's default of 8 recompiles per frame allows.
    """
    import torch._dynamo

    cfg = torch._dynamo.config
    for name, value in (("recompile_limit", 1024), ("cache_size_limit", 1024),
                        ("accumulated_recompile_limit", 16384), ("accumulated_cache_size_limit", 16384)):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), value))
    model.forward = torch.compile(model.forward, backend=backend)


def run(args) -> list[dict]:
    import wide
    from wide.modeling.fuse import fuse_glue
    from wide.modeling.inference import enable_kernels

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    torch.manual_seed(0)
    model = build_model(args.model, args.layers, args.device, dtype)
    dev = next(model.parameters()).device
    rows: list[dict] = []
    if args.compile:
        compile_forward(model, args.compile)
    if args.fuse_glue:
        fuse_glue(model, args.fuse_glue)

    # prefill: eager on both sides, and (with graphs on a GPU) replayed from a CUDA graph on both sides; an int
    # mode is a chunked prefill through `wide.Generator` (chunks replayed from one graph) on both sides
    prefill_modes = [False] + ([True] if not args.no_graphs and dev.type == "cuda" else []) + list(args.prefill_chunk)

    def time_prefill(t: int, graph) -> tuple[float, str]:
        chunked = not isinstance(graph, bool)
        runner = ChunkedPrefillRunner(model, t, graph) if chunked else PrefillRunner(model, t, graph)
        ms = timed(runner.step, iters=args.iters)
        mode = runner.mode
        del runner
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        return ms, mode

    dense = {}
    for t in args.prefill:
        for graph in prefill_modes:
            dense[("prefill", 1, t, graph)] = time_prefill(t, graph)
    dense_variants = {}
    for b in args.decode_batch:
        ms, best, times = best_dense_decode(model, b, args.context, not args.no_graphs, args.iters * 4)
        dense[("decode", b, args.context)] = (ms, best)
        dense_variants[b] = times

    if args.checkpoint:
        from wide.checkpoint import load_trained, read_metadata

        cfg = read_metadata(args.checkpoint)["wide_config"]
        wide.apply_wide(model, cfg)
        load_trained(model, args.checkpoint)
        sparsities = [cfg.sparsity]
    else:
        cfg = wide.WideConfig(sparsity=max(args.sparsity), router=args.router, attn_group_size=args.attn_group_size,
                              ffn_group_size=args.ffn_group_size, backend=args.backend)
        wide.apply_wide(model, cfg)
        sparsities = args.sparsity
    model.eval()
    enable_kernels(model, args.backend)
    wide.set_overlap_routing(model, not args.no_overlap_routing)
    if args.fuse_glue:
        fuse_glue(model, args.fuse_glue)  # the routed MLPs run the fused swiglu kernel; norms and RoPE stay fused
    if args.compile:
        torch._dynamo.reset()  # the dense side's frames guard on modules the routed model replaced
    variants = [("per-token", None, 1.0)] + ([(_coherent_name(s), args.coherent_refresh, s)
                                              for s in args.coherent_keep_scale] if args.coherent else [])
    for s in sparsities:
        if not args.checkpoint:
            set_synthetic_rate(model, args.router, s, tokens=min(512, max(args.prefill, default=512)))
        for t in args.prefill:
            for graph in prefill_modes:
                ms, rmode = time_prefill(t, graph)
                realized = _realized(model)
                d, dmode = dense[("prefill", 1, t, graph)]
                mode = dmode if dmode == rmode else f"dense {dmode} / routed {rmode}"
                rows.append(dict(phase="prefill", batch=1, tokens=t, sparsity=s, **realized,
                                 routing="per-token", dense_ms=d, routed_ms=ms, ratio=d / ms, mode=mode))
        for name, refresh, scale in variants:
            wide.modeling.inference.set_coherent_decode(model, refresh, args.coherent_memory, keep_scale=scale)
            for b in args.decode_batch:
                runner = DecodeRunner(model, b, args.context, not args.no_graphs)
                ms = timed(runner.step, warmup=3, iters=args.iters * 4)
                realized = _realized(model)  # the last timed step's masks (a graph replay rewrites them)
                d, dmode = dense[("decode", b, args.context)]
                rows.append(dict(phase="decode", batch=b, tokens=args.context, sparsity=s, **realized,
                                 routing=name, dense_ms=d, routed_ms=ms, ratio=d / ms,
                                 mode=f"dense {dmode} / routed {runner.mode}", dense_variants=dense_variants[b]))
                del runner
        wide.modeling.inference.set_coherent_decode(model, None)
    return rows


def set_synthetic_rate(model, router: str, sparsity: float, tokens: int = 512) -> None:
    """Make the bench's synthetic routers skip ``sparsity``: ``random`` routers take it as their rate, untrained
    linear / low-rank ones get their execute biases calibrated to it (`calibrate_routers`)."""
    import wide

    if router == "random":
        for wl in wide.modeling.runtime_of(model).layers:
            for r in wl.routers.values():
                r.rate = sparsity
    else:
        calibrate_routers(model, sparsity, tokens=tokens)


@torch.no_grad()
def calibrate_routers(model, sparsity: float, tokens: int = 512, passes: int = 2, seed: int = 0) -> None:
    """Make untrained linear / low-rank routers skip ``sparsity`` of their (token, group) pairs (bench only).

    `wide bench --router lowrank` times the router a trained model would run (its kernels and launches), with
    random weights: each router's execute bias is shifted by the ``sparsity`` quantile of its margins per group,
    over the residual streams of one prompt of ``tokens`` random ids (``passes`` times, as each layer's input
    depends on the routers before it), and its expected rate (the kernels' density hint) set to ``sparsity``.
    The rates it then realizes are the bench's "realized" columns.
    """
    import dataclasses

    import wide

    layers = wide.modeling.runtime_of(model).layers
    routers = [(i, k, r) for i, wl in enumerate(layers) for k, r in wl.routers.items()]
    for _, _, r in routers:
        bias = _execute_bias(r)
        if bias is None:
            raise ValueError(f"--router: {type(r).__name__} has no execute bias to calibrate (linear / lowrank only)")
        r.spec = dataclasses.replace(r.spec, target_sparsity=float(sparsity))
    device = next(model.parameters()).device
    gen = torch.Generator(device="cpu").manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (1, tokens), generator=gen).to(device)
    for _ in range(passes):
        seen: dict = {}
        for i, k, r in routers:
            real = type(r).execute_decision

            def record(hidden, backend="torch", margin=False, _r=r, _real=real, _key=(i, k)):
                if _key not in seen:
                    seen[_key] = hidden.reshape(-1, hidden.shape[-1]).clone()
                return _real(_r, hidden, backend=backend, margin=margin)

            r.execute_decision = record  # this instance only, for one forward
        try:
            model(input_ids=ids, use_cache=False)
        finally:
            for _, _, r in routers:
                del r.execute_decision
        for i, k, r in routers:
            if (i, k) not in seen:
                continue
            m = r.execute_decision(seen[(i, k)], margin=True).float()  # [tokens, G]
            q = torch.quantile(m, float(sparsity), dim=0) if sparsity > 0 else m.amin(0) - 1.0
            _execute_bias(r).sub_(q.to(_execute_bias(r).dtype))


KERNEL_SWITCHES = ("WIDE_KERNEL_BACKEND",)


def kernel_switches() -> dict:
    """The environment variables that change which kernels routed ops take, where set: a table timed under one
    of them says so (report line and JSON ``env``; the kernel options it ran with go to ``kernel_options``)."""
    return {k: os.environ[k] for k in KERNEL_SWITCHES if k in os.environ}


def _execute_bias(router):
    """The execute rows' bias (interleaved execute / skip outputs) of a linear or low-rank router, or None."""
    layer = getattr(router, "up", None)
    layer = layer if layer is not None else getattr(router, "proj", None)
    if layer is None or getattr(layer, "bias", None) is None:
        return None
    return layer.bias.view(-1, 2)[:, 0]  # a view of the parameter: in-place changes bump its version (the folded
    # margin cache sees them; `.data` would not)


def _decode_usage(model) -> tuple[float, float]:
    """Of the last decode step's routed groups (mean over layers and kinds): the fraction a row runs, and the
    fraction some row of the batch runs — the weights the step must read."""
    import wide

    run, read = [], []
    for wl in wide.modeling.runtime_of(model).layers:
        for mask in wl.group_mask.values():
            m = mask.reshape(mask.shape[0], -1, mask.shape[-1])[:, -1] > 0.5  # [B, G]
            run.append(m.float().mean())
            read.append(m.any(0).float().mean())
    if not run:
        return 1.0, 1.0
    return torch.stack(run).mean().item(), torch.stack(read).mean().item()


def decode_nll(model, ids: torch.Tensor, prefix: int, usage: Optional[list] = None) -> float:
    """Mean NLL of the tokens after ``prefix``, each predicted in a decode step (one token per row, cache);
    ``usage`` (a list) collects `_decode_usage` after every decode step."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    kw = cache_kwarg(model)
    total, count = 0.0, 0
    with torch.inference_mode():
        out = model(input_ids=ids[:, :prefix], **{kw: cache}, use_cache=True, logits_to_keep=1)
        logits = out.logits[:, -1]
        for t in range(prefix, ids.shape[1]):
            total += torch.nn.functional.cross_entropy(logits.float(), ids[:, t], reduction="sum").item()
            count += ids.shape[0]
            out = model(input_ids=ids[:, t:t + 1], **{kw: cache}, use_cache=True)
            logits = out.logits[:, -1]
            if usage is not None:
                usage.append(_decode_usage(model))
    return total / count


def _coherent_name(scale: float) -> str:
    return "coherent" if scale == 1.0 else f"coherent x{scale:g}"


def decode_quality(model, tokenizer, *, batch: int, prefix: int, steps: int, n_seqs: int,
                   refresh: int = 1, memory: float = 0.0, docs: Optional[list[str]] = None,
                   keep_scales: tuple = (1.0,)) -> list[dict]:
    """Decode-time quality of per-token vs batch-coherent routing (and dense), on held-out prose.

    Sequences of ``prefix + steps`` tokens from the default corpus's validation split are decoded
    teacher-forced in batches of ``batch``; the NLL of the ``steps`` decode-time tokens is reported, with
    the share of routed groups a row runs and the share some row of the step runs (the weights a decode
    step reads), averaged over layers, kinds and steps. ``docs`` replaces the corpus (tests). One coherent row
    per ``keep_scales`` entry (``CoherentDecode.keep_scale``).
    """
    import math

    import wide
    from wide.data import default_corpus_split
    from wide.modeling.inference import set_coherent_decode

    need = prefix + steps
    seqs = []
    for doc in docs if docs is not None else default_corpus_split()[1]:
        ids = tokenizer(doc, add_special_tokens=False)["input_ids"]
        if len(ids) >= need:
            seqs.append(ids[:need])
        if len(seqs) == n_seqs:
            break
    dev = next(model.parameters()).device
    data = torch.tensor(seqs, device=dev)
    runtime = wide.modeling.runtime_of(model)

    def measure(usage: list) -> float:
        return sum(decode_nll(model, data[i:i + batch], prefix, usage)
                   for i in range(0, len(data), batch)) / math.ceil(len(data) / batch)

    rows = []
    variants = [("dense", 1.0), ("per-token", 1.0)] + [(_coherent_name(s), s) for s in keep_scales]
    for name, scale in variants:
        for wl in runtime.layers:
            wl.forced = ({k: torch.ones(1, 1, s.num_groups, device=dev) for k, s in wl.slots.items()}
                         if name == "dense" else {})
        set_coherent_decode(model, refresh if name.startswith("coherent") else None, memory, keep_scale=scale)
        usage: list = []
        nll = measure(usage)
        run = sum(u[0] for u in usage) / max(1, len(usage))
        read = sum(u[1] for u in usage) / max(1, len(usage))
        rows.append(dict(routing=name, batch=batch, nll=nll, ppl=math.exp(nll), seqs=len(data), steps=steps,
                         row_runs=run, weights_read=read))
    for wl in runtime.layers:
        wl.forced = {}
    set_coherent_decode(model, None)
    return rows


def _realized(model) -> dict:
    """Realized sparsity of the model's last forward — the kinds averaged (the training target's rate) and by
    routed weight (what speed follows) — as row fields (NaN if it kept no statistics)."""
    import wide

    stats = wide.sparsity_stats(model)
    if stats is None:
        return dict(realized=float("nan"), realized_by_weight=float("nan"))
    return dict(realized=float(stats.realized()), realized_by_weight=float(stats.realized_by_weight()))


def format_table(rows: list[dict]) -> str:
    head = ("| phase | batch | tokens | sparsity | realized | by weight | routing | dense ms | routed ms | dense/routed "
            "| mode |\n|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        realized = r.get("realized", float("nan"))
        by_weight = r.get("realized_by_weight", float("nan"))
        lines.append(f"| {r['phase']} | {r['batch']} | {r['tokens']} | {r['sparsity']:.2f} | {realized:.3f} | "
                     f"{by_weight:.3f} | "
                     f"{r['routing']} | {r['dense_ms']:.2f} | {r['routed_ms']:.2f} | {r['ratio']:.2f}x | {r['mode']} |")
    return "\n".join(lines)


def quality_main(args) -> int:
    import wide
    from transformers import AutoTokenizer

    from wide.assets import resolve_model

    if not args.model:
        raise SystemExit("wide bench --quality: needs --model (a model with a tokenizer)")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    model = build_model(args.model, args.layers, args.device, dtype)
    tok = AutoTokenizer.from_pretrained(resolve_model(args.model))
    if args.checkpoint:
        from wide.checkpoint import load_trained, read_metadata

        wide.apply_wide(model, read_metadata(args.checkpoint)["wide_config"])
        load_trained(model, args.checkpoint)
    else:
        wide.apply_wide(model, wide.WideConfig(sparsity=args.sparsity[0], router="topk",
                                               attn_group_size=args.attn_group_size, ffn_group_size=args.ffn_group_size))
    model.eval()
    rows = []
    for b in args.decode_batch:
        rows += decode_quality(model, tok, batch=b, prefix=args.quality_prefix, steps=args.quality_steps,
                               n_seqs=args.quality_seqs, refresh=args.coherent_refresh, memory=args.coherent_memory,
                               keep_scales=tuple(args.coherent_keep_scale))
    print("| routing | batch | decode-token NLL | perplexity | groups a row runs | groups read (any row) | "
          "sequences x steps |\n|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['routing']} | {r['batch']} | {r['nll']:.4f} | {r['ppl']:.2f} | {r['row_runs']:.1%} | "
              f"{r['weights_read']:.1%} | {r['seqs']} x {r['steps']} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "quality": rows}, indent=2))
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="wide bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="local model / asset (default: random Llama-3.1-8B shape)")
    p.add_argument("--layers", type=int, default=None, help="keep only the first N decoder layers")
    p.add_argument("--checkpoint", default=None, help="trained routers (.safetensors) instead of synthetic masks")
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
    from wide.kernels import backend_choices

    p.add_argument("--backend", default="auto", choices=backend_choices())
    p.add_argument("--kernel-option", action="append", default=[], metavar="NAME=0|1",
                   help="an A/B switch of the fused kernels' default configs (wide.kernels.KernelOptions: "
                        "persistent_mn, skinny_swap, decode_fold), e.g. skinny_swap=0; repeatable")
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
    p.add_argument("--no-graphs", action="store_true")
    p.add_argument("--no-overlap-routing", action="store_true",
                   help="decide a decode step's attention mask on the main stream, not beside the K/V projections")
    p.add_argument("--compile", nargs="?", const="inductor", default=None, metavar="BACKEND",
                   help="torch.compile the forward on both sides (default backend: inductor); the routed ops "
                        "stay eager graph breaks, the glue between them is compiled")
    p.add_argument("--fuse-glue", nargs="?", const="inductor", default=None, metavar="BACKEND",
                   help="compile HF's RMS norms, RoPE and the dense MLP's act*up on both sides (wide.fuse_glue; "
                        "default backend: inductor): seconds to compile, CUDA-graph capturable")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--json", default=None, help="write the rows as JSON here")
    p.add_argument("--quality", action="store_true",
                   help="instead of timing: decode-time perplexity of dense / per-token / coherent routing "
                        "(needs --model with a tokenizer and --checkpoint or synthetic routers)")
    p.add_argument("--quality-seqs", type=int, default=16)
    p.add_argument("--quality-prefix", type=int, default=64)
    p.add_argument("--quality-steps", type=int, default=32)
    return p


def bench_main(argv: Optional[list[str]] = None) -> int:
    args = parser().parse_args(argv)
    for name in ("sparsity",):
        for v in getattr(args, name):
            if not 0 <= v < 1:
                raise SystemExit(f"wide bench: --sparsity values must be in [0, 1), got {v}")
    for v in args.prefill_chunk:
        if v < 16:
            raise SystemExit(f"wide bench: --prefill-chunk values must be at least 16 tokens, got {v}")
    for v in args.coherent_keep_scale:
        if not 0 < v <= 16:
            raise SystemExit(f"wide bench: --coherent-keep-scale values must be in (0, 16], got {v}")
    if args.checkpoint and args.router != "random":
        raise SystemExit("wide bench: --router picks the synthetic masks' source; --checkpoint brings trained routers")
    from wide.kernels import KernelOptions, use_kernel_options

    try:
        options = KernelOptions.parse(args.kernel_option)
    except ValueError as err:
        raise SystemExit(f"wide bench: {err}") from None
    t0 = time.time()
    with use_kernel_options(options):
        if args.quality:
            return quality_main(args)
        rows = run(args)
    table = format_table(rows)
    print(table)
    seen = set()
    for r in rows:
        if r["phase"] == "decode" and r["batch"] not in seen:
            seen.add(r["batch"])
            print(f"dense decode batch {r['batch']}: " + ", ".join(
                f"{k} {v:.2f} ms" for k, v in r["dense_variants"].items()) + " (fastest is the baseline)")
    if args.compile:
        print(f"both sides' forwards under torch.compile(backend={args.compile!r}); routed ops run as eager graph breaks")
    if args.fuse_glue:
        print(f"both sides' RMS norms, RoPE and dense MLP act*up compiled (wide.fuse_glue, {args.fuse_glue})")
    if args.no_overlap_routing:
        print("routed decode: the attention router on the main stream (--no-overlap-routing)")
    switches = kernel_switches()
    if switches:
        print("kernel switches from the environment: " + ", ".join(f"{k}={v}" for k, v in switches.items()))
    if options.changed():
        print("kernel options: " + ", ".join(f"{k}={int(v)}" for k, v in options.changed().items()))
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    print(f"\n{dev}, torch {torch.__version__}, {time.time() - t0:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": dev, "torch": torch.__version__, "args": vars(args),
                                               "env": switches, "kernel_options": options.changed(), "rows": rows},
                                              indent=2))
    return 0
