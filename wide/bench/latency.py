"""The latency rows of ``wide bench``: each prefill and decode shape timed on the dense model, then on the routed one
at every sparsity (synthetic masks) or with the checkpoint's routers."""

from __future__ import annotations

from typing import Optional

import torch

from wide.bench.dense import best_dense_decode, fused_dense_decode
from wide.bench.floor import StepShape, decode_step_bytes, floor_fields, router_bytes, step_masks
from wide.bench.models import build_model, compile_forward, use_text_ids
from wide.bench.report import coherent_name
from wide.bench.runners import ChunkedPrefillRunner, DecodeRunner, PrefillRunner, timed
from wide.bench.synthetic import set_synthetic_rate


def run_latency(args, bandwidth: Optional[dict] = None, ids: Optional[torch.Tensor] = None) -> list[dict]:
    """The latency rows of one ``wide bench`` run (``args``: its parsed flags); dense times are taken first, then the
    model is routed in place and timed at every sparsity. Decode rows carry each side's bytes read per step and,
    given the device's measured ``bandwidth`` (`wide.bench.floor.measure_bandwidth`), its floor. ``ids``: a token
    stream every timed forward cuts its ids from (`wide.bench.models.bench_ids`); ``None``: random ids."""
    import wide
    from wide.kernels import kernel_options
    from wide.modeling.fuse import fuse_glue
    from wide.modeling.inference import enable_kernels

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    torch.manual_seed(0)
    model = build_model(args.model, args.layers, args.device, dtype)
    if ids is not None:
        use_text_ids(model, ids)
    dev = next(model.parameters()).device
    shape = StepShape.of(model)
    keys = args.context + 1  # the prompt and the step's own token
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
        ms, best, times = best_dense_decode(model, b, args.context, not args.no_graphs, args.iters * 4,
                                            compile_spec=args.dense_compile)
        dense[("decode", b, args.context)] = (ms, best, floor_fields("dense", decode_step_bytes(shape, b, keys), ms,
                                                                     bandwidth))
        dense_variants[b] = times
    if args.dense_compile:
        torch._dynamo.reset()  # drops the compiled dense steps (and what their guards hold) before routing

    if args.checkpoint:
        from wide.io.checkpoint import read_metadata
        from wide.io.loading import apply_checkpoint

        meta = read_metadata(args.checkpoint)
        cfg = meta["wide_config"]
        # a stage-2 file's adapter is merged into the weights, as deployed: the routers read the hidden states
        # they were trained on, and the timed GEMMs are the plain (merged) ones
        apply_checkpoint(model, meta, lora_alpha=args.lora_alpha)
        sparsities = [cfg.sparsity]
    else:
        cfg = wide.WideConfig(sparsity=max(args.sparsity), router=args.router, attn_group_size=args.attn_group_size,
                              ffn_group_size=args.ffn_group_size, backend=args.backend)
        wide.apply_wide(model, cfg)
        sparsities = args.sparsity
    model.eval()
    enable_kernels(model, args.backend)
    wide.set_overlap_routing(model, not args.no_overlap_routing)
    wide.set_weight_layout(model, getattr(args, "weight_layout", "row"))
    if args.fuse_glue:
        fuse_glue(model, args.fuse_glue)  # the routed MLPs run the fused swiglu kernel; norms and RoPE stay fused
    if args.compile:
        torch._dynamo.reset()  # the dense side's frames guard on modules the routed model replaced
    if kernel_options().decode_qkv or kernel_options().decode_residual:
        # the dense step with the routed step's fused launches (routing off): the baseline when it is faster
        for b in args.decode_batch:
            d_ms, d_name, _ = dense[("decode", b, args.context)]
            key, ms = fused_dense_decode(model, b, args.context, not args.no_graphs, args.iters * 4, d_name)
            dense_variants[b][key] = ms
            if ms < d_ms:
                dense[("decode", b, args.context)] = (ms, key, floor_fields(
                    "dense", decode_step_bytes(shape, b, keys), ms, bandwidth))
    variants = [("per-token", None, 1.0)] + ([(coherent_name(s), args.coherent_refresh, s)
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
                ms = runner.time(warmup=3, iters=args.iters * 4)
                # rates and bytes read after each of the runner's tokens' steps (a graph replay rewrites the masks)
                rbytes = router_bytes(model)
                seen = runner.average(lambda: {"realized": _realized(model), "bytes": decode_step_bytes(
                    shape, b, keys, step_masks(model), rbytes)})
                realized, routed = seen["realized"], seen["bytes"]
                d, dmode, dfloor = dense[("decode", b, args.context)]
                rows.append(dict(phase="decode", batch=b, tokens=args.context, sparsity=s, **realized,
                                 routing=name, dense_ms=d, routed_ms=ms, ratio=d / ms,
                                 mode=f"dense {dmode} / routed {runner.mode}", dense_variant=dmode,
                                 dense_variants=dense_variants[b], **dfloor,
                                 **floor_fields("routed", routed, ms, bandwidth)))
                del runner
        wide.modeling.inference.set_coherent_decode(model, None)
    return rows


def _realized(model) -> dict:
    """Realized sparsity of the model's last forward — the kinds averaged (the training target's rate) and by
    routed weight (what speed follows) — as row fields (NaN if it kept no statistics)."""
    import wide

    stats = wide.sparsity_stats(model)
    if stats is None:
        return dict(realized=float("nan"), realized_by_weight=float("nan"))
    return dict(realized=float(stats.realized()), realized_by_weight=float(stats.realized_by_weight()))
