"""Log-likelihood of continuations given contexts, batched, as lm-evaluation-harness's HF model scores them.

Encoding follows lm-eval's ``HFLM``: trailing whitespace of the context moves to the front of the
continuation; ``context + continuation`` is encoded as a whole and the continuation's tokens are the
ones after the context's own encoding (so a merge across the boundary is scored as lm-eval does); no
special tokens unless ``add_bos`` (lm-eval adds BOS only for Gemma models); sequences longer than
``max_length + 1`` are cut from the left. The score is the sum of the continuation tokens' log-probs,
plus whether each was the argmax (lm-eval's ``is_greedy``).

Batches are left-padded, with explicit ``position_ids`` and an attention mask, so every real token
sees exactly what it would see unpadded (and padding never counts toward realized sparsity), and only
the last ``max continuation length`` positions are projected to the vocabulary. Log-softmax runs in
float32 whatever the model dtype (lm-eval takes it in the model's dtype; bfloat16 logits can flip
near-ties).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
from torch import nn

from wide.eval.meter import SparsityMeter


@dataclass(frozen=True)
class Request:
    context: str
    continuation: str


def wants_bos(model: nn.Module, add_bos: str = "auto") -> bool:
    """``auto``: lm-eval's rule, BOS only for Gemma-family models; ``yes``/``no`` force it."""
    if add_bos not in ("auto", "yes", "no"):
        raise ValueError(f"add_bos: must be auto, yes or no, got {add_bos!r}")
    if add_bos != "auto":
        return add_bos == "yes"
    return "gemma" in str(getattr(model.config, "model_type", "")).lower()


def max_length(model: nn.Module, tokenizer) -> int:
    """lm-eval's ``HFLM.max_length``: the model config's context length, else the tokenizer's, else 2048."""
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    for attr in ("n_positions", "max_position_embeddings", "n_ctx"):
        value = getattr(cfg, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(limit, int) and 0 < limit < 10**8:
        return limit
    return 2048


class Encoder:
    """Turns ``(context, continuation)`` into token ids the way lm-eval does."""

    def __init__(self, tokenizer, add_bos: bool):
        self.tokenizer = tokenizer
        self.add_bos = add_bos
        self.bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id

    def encode(self, text: str) -> list[int]:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return ([self.bos] + ids) if self.add_bos and self.bos is not None else ids

    def pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        if context == "":  # lm-eval conditions an empty context on the prefix (BOS, else EOS) token
            return [self.bos], self.tokenizer(continuation, add_special_tokens=False)["input_ids"]
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces:
            continuation = context[-n_spaces:] + continuation
            context = context[:-n_spaces]
        whole = self.encode(context + continuation)
        ctx = self.encode(context)
        return ctx, whole[len(ctx):]


@torch.inference_mode()
def loglikelihoods(
    model: nn.Module,
    tokenizer,
    requests: Sequence[Request],
    *,
    batch_size: int = 8,
    add_bos: str = "auto",
    meter: Optional[SparsityMeter] = None,
    progress: Optional[Callable[[int, int], None]] = None,
) -> list[tuple[float, bool]]:
    """``(sum log p(continuation | context), is_greedy)`` per request, in request order.

    Args:
        model: A causal LM (routed or not) in eval mode.
        tokenizer: Its tokenizer.
        requests: The pairs to score.
        batch_size: Sequences per forward.
        add_bos: ``auto`` (lm-eval's rule), ``yes`` or ``no``.
        meter: Accumulates realized sparsity over every forward (valid tokens only).
        progress: Called with ``(finished, total)`` requests after each batch.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size: must be >= 1, got {batch_size}")
    enc = Encoder(tokenizer, wants_bos(model, add_bos))
    limit = max_length(model, tokenizer)
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    items = []
    for i, req in enumerate(requests):
        ctx, cont = enc.pair(req.context, req.continuation)
        if not cont:
            raise ValueError(f"request {i}: the continuation {req.continuation!r} encodes to no tokens")
        full = (ctx + cont)[-(limit + 1):]
        inp = full[:-1]
        n_cont = min(len(cont), len(inp))
        items.append((i, inp, full[len(full) - n_cont:], n_cont))
    # longest first, as lm-eval orders them: memory peaks on the first batch and batches are homogeneous
    order = sorted(range(len(items)), key=lambda k: (-len(items[k][1]), k))
    out: list[Optional[tuple[float, bool]]] = [None] * len(items)
    done = 0
    for start in range(0, len(order), batch_size):
        batch = [items[k] for k in order[start:start + batch_size]]
        width = max(len(b[1]) for b in batch)
        keep = max(b[3] for b in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for r, (_, inp, _, _) in enumerate(batch):
            ids[r, width - len(inp):] = torch.tensor(inp, dtype=torch.long)
            mask[r, width - len(inp):] = 1
        ids, mask = ids.to(device), mask.to(device)
        positions = (mask.cumsum(-1) - 1).clamp_min(0)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=keep).logits
        if meter is not None:
            meter.update(mask.sum())
        logp = torch.log_softmax(logits.float(), dim=-1)  # [B, keep, V]
        tgt = torch.zeros((len(batch), keep), dtype=torch.long)
        scored = torch.zeros((len(batch), keep), dtype=torch.bool)
        for r, (_, _, target, n_cont) in enumerate(batch):
            tgt[r, keep - n_cont:] = torch.tensor(target, dtype=torch.long)
            scored[r, keep - n_cont:] = True
        tgt, scored = tgt.to(logp.device), scored.to(logp.device)
        token_lp = logp.gather(-1, tgt[..., None]).squeeze(-1)
        scores = (token_lp * scored).sum(-1)
        greedy = ((logp.argmax(-1) == tgt) | ~scored).all(-1)
        for (idx, *_), s, g in zip(batch, scores.tolist(), greedy.tolist()):
            out[idx] = (s, g)
        done += len(batch)
        if progress is not None:
            progress(done, len(items))
    return out  # type: ignore[return-value]
