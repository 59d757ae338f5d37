"""Perplexity on held-out prose with a fixed window and stride.

Protocol (the same token stream ``wide fit``'s packed validation sees):

1. Documents: the default corpus's held-out split (``wide.data.corpus.default_corpus_split()[1]``,
   294 Wikipedia paragraphs, 37,466 SmolLM2 tokens), or any source ``wide.data`` reads (a prose
   corpus name, a ``.txt``/``.jsonl``/``.parquet`` file or folder, a ``save_to_disk`` folder). A
   non-default source is evaluated whole (no split): point it at text held out from training.
2. Each document becomes ``[bos] + tokens + [eos]`` (``bos`` only where the tokenizer adds one by
   default), documents are concatenated in order and, with ``max_tokens``, cut to that many tokens.
3. Windows of ``window`` tokens start every ``stride`` tokens; a window scores the predictions of
   its tokens that lie past the previous window's end (a window's first token has no context in it
   and is never scored). ``stride == window`` (the default) is the non-overlapping protocol of the
   pruning literature (SparseGPT, Wanda: ``window - 1`` predictions per window). ``stride < window``
   scores every token after the first exactly once, each with at least ``window - stride`` tokens of
   context. The last, shorter window is kept.
4. ``ppl = exp(total NLL / scored tokens)``.

Realized sparsity is token-weighted over every token the model ran (context tokens included).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from wide.eval import DEFAULT_WINDOW
from wide.eval.meter import SparsityMeter

__all__ = ["DEFAULT_WINDOW", "perplexity", "token_stream", "windows"]


def token_stream(tokenizer, docs: Sequence[str], max_tokens: Optional[int] = None) -> np.ndarray:
    """``[bos] + ids + [eos]`` per document (``bos`` only if the tokenizer adds one), concatenated."""
    bos = tokenizer.bos_token_id
    adds_bos = bos is not None and tokenizer("a", add_special_tokens=True)["input_ids"][:1] == [bos]
    eos = tokenizer.eos_token_id
    pieces, total = [], 0
    for start in range(0, len(docs), 256):
        enc = tokenizer(list(docs[start:start + 256]), add_special_tokens=False)["input_ids"]
        for ids in enc:
            piece = ([bos] if adds_bos else []) + ids + ([eos] if eos is not None else [])
            pieces.append(np.asarray(piece, dtype=np.int64))
            total += len(piece)
        if max_tokens is not None and total >= max_tokens:
            break
    stream = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
    return stream[:max_tokens] if max_tokens is not None else stream


def windows(n_tokens: int, window: int, stride: int) -> list[tuple[int, int, int]]:
    """``(begin, end, n_scored)`` per window: scores the last ``n_scored`` predictions of ``[begin, end)``."""
    if window < 2:
        raise ValueError(f"window: must be >= 2, got {window}")
    if not 1 <= stride <= window:
        raise ValueError(f"stride: must be in [1, window={window}], got {stride}")
    out, prev_end = [], 0
    for begin in range(0, max(1, n_tokens - 1), stride):
        end = min(begin + window, n_tokens)
        n_scored = end - max(prev_end, begin + 1)  # the first token of the stream has nothing to predict it
        if n_scored > 0:
            out.append((begin, end, n_scored))
        prev_end = end
        if end == n_tokens:
            break
    return out


@torch.inference_mode()
def perplexity(
    model: nn.Module,
    tokenizer,
    docs: Sequence[str],
    *,
    window: int = DEFAULT_WINDOW,
    stride: Optional[int] = None,
    max_tokens: Optional[int] = None,
    batch_size: int = 4,
    progress: Optional[Callable[[int, int], None]] = None,
) -> dict[str, Any]:
    """Perplexity of ``docs`` (see the module docstring for the protocol).

    Args:
        model: Causal LM (routed or not) in eval mode.
        tokenizer: Its tokenizer.
        docs: The held-out documents.
        window: Tokens per forward (capped at the model's context length by the caller's choice).
        stride: Tokens between window starts; default ``window`` (non-overlapping).
        max_tokens: Evaluate only the first this many tokens of the stream.
        batch_size: Windows per forward (the final shorter window runs alone).
        progress: Called with ``(finished, total)`` windows after each forward.

    Returns:
        ``{"ppl", "nll", "tokens" (scored), "windows", "window", "stride", "sparsity": {...}}``.
    """
    stride = window if stride is None else stride
    stream = token_stream(tokenizer, docs, max_tokens)
    spans = windows(len(stream), window, stride)
    if not spans:
        raise ValueError(f"perplexity: the text has {len(stream)} tokens; at least 2 are needed")
    device = next(model.parameters()).device
    meter = SparsityMeter(model)
    nll_sum = torch.zeros((), dtype=torch.float64, device=device)
    scored_total = 0
    groups: list[list[tuple[int, int, int]]] = []
    for span in spans:  # batch windows of equal length together
        if groups and len(groups[-1]) < batch_size and groups[-1][0][1] - groups[-1][0][0] == span[1] - span[0]:
            groups[-1].append(span)
        else:
            groups.append([span])
    done = 0
    for group in groups:
        ids = torch.from_numpy(np.stack([stream[b:e] for b, e, _ in group])).to(device)
        mask = torch.ones_like(ids)
        logits = model(input_ids=ids, attention_mask=mask).logits
        meter.update(torch.tensor(float(ids.numel())))
        for r, (_, _, n) in enumerate(group):  # row by row: float32 logits of one row at a time
            nll = F.cross_entropy(logits[r, -n - 1:-1].float(), ids[r, -n:], reduction="sum")
            nll_sum += nll.double()
            scored_total += n
        done += len(group)
        if progress is not None:
            progress(done, len(spans))
    nll = float(nll_sum) / scored_total
    return {
        "ppl": math.exp(nll),
        "nll": nll,
        "tokens": scored_total,
        "stream_tokens": int(len(stream)),
        "windows": len(spans),
        "window": window,
        "stride": stride,
        "sparsity": meter.result(),
    }
