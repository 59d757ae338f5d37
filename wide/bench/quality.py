"""``wide bench --quality``: decode-time perplexity of dense, per-token and batch-coherent routing, with the share
of routed groups a row runs and the share a decode step reads."""

from __future__ import annotations

from typing import Optional

import torch

from wide.bench.report import coherent_name
from wide.modeling.generate import cache_kwarg


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
    variants = [("dense", 1.0), ("per-token", 1.0)] + [(coherent_name(s), s) for s in keep_scales]
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


def quality_rows(args) -> list[dict]:
    """`decode_quality` rows of ``wide bench --quality``: the ``--model`` with the ``--checkpoint``'s routers, or
    training-free top-k routing at the first ``--sparsity``, at every ``--decode-batch``."""
    from transformers import AutoTokenizer

    import wide
    from wide.assets import resolve_model
    from wide.bench.models import build_model

    if not args.model:
        raise SystemExit("wide bench --quality: needs --model (a model with a tokenizer)")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    model = build_model(args.model, args.layers, args.device, dtype)
    tok = AutoTokenizer.from_pretrained(resolve_model(args.model))
    if args.checkpoint:
        from wide.io.loading import apply_checkpoint

        apply_checkpoint(model, args.checkpoint, lora_alpha=args.lora_alpha)  # a stage-2 adapter merged, as deployed
    else:
        wide.apply_wide(model, wide.WideConfig(sparsity=args.sparsity[0], router="topk",
                                               attn_group_size=args.attn_group_size, ffn_group_size=args.ffn_group_size))
    model.eval()
    rows = []
    for b in args.decode_batch:
        rows += decode_quality(model, tok, batch=b, prefix=args.quality_prefix, steps=args.quality_steps,
                               n_seqs=args.quality_seqs, refresh=args.coherent_refresh, memory=args.coherent_memory,
                               keep_scales=tuple(args.coherent_keep_scale))
    return rows
