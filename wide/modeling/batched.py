"""Many prompts of any lengths through `wide.Generator`, which takes unpadded batches of one length.

Prompts are sorted by token length and cut into batches of up to ``batch_size`` rows whose lengths differ by at most
``length_spread`` tokens. A batch prefills its shortest prompt's length from every row; a longer row then feeds the
rest of its own prompt through its first decode steps instead of its predictions (`Generator.generate`'s ``tails``),
so all rows stay at one position and the cache needs no padding. Before that, only prompts of exactly the same
length batched together: 3,000 chat prompts of Qwen2.5-1.5B made mostly batches of 1–8 rows (2026-12-03). A short
batch is filled up with copies of its last row to the next power of two, so only a few batch sizes occur and each
gets one `Generator` (its static cache and CUDA graphs are kept from one batch to the next).
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
from torch import nn

from wide.modeling.generate import PREFILL_MODES, Generator, cut_at_stop

__all__ = ["generate_many"]


def generate_many(model: nn.Module, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, batch_size: int = 16,
                  stop_ids: Sequence[int] = (), temperature: float = 0.0, seed: int = 0,
                  graphs: Optional[bool] = None, progress: Optional[Callable[[int, int], None]] = None,
                  length_spread: int = 32, prefill: str = "routed") -> list[list[int]]:
    """The new tokens of every prompt (before the first stop token, which is left out), in prompt order.

    Args:
        model: An HF causal LM in eval mode (dense or routed).
        prompts: Token ids per prompt (no padding), each at least one token.
        max_new_tokens: Tokens to generate at most per prompt.
        batch_size: Rows per batch at most.
        stop_ids: Tokens that end an answer (any of them; the loop stops once every row has emitted one).
        temperature: 0 for greedy, else the sampling temperature.
        seed: Seed of the sampling; each batch draws from its own generator seeded by ``seed`` and the batch's
            first prompt index, so the same prompts give the same samples whatever ran before.
        graphs: Capture and replay CUDA graphs (default: on CUDA).
        progress: Called with ``(prompts done, prompts)`` after each batch.
        length_spread: Most tokens by which the prompts of one batch may differ in length (each extra prompt token
            of a row costs the batch one decode step); 0 batches equal lengths only. A routed model with batch-coherent
            decode (`wide.set_coherent_decode`) always takes 0: its decode steps route rows together, a prompt's
            prefill does not.
        prefill: ``"routed"`` or ``"dense"`` (each prompt with routing off, only the decode steps routed; see
            `wide.Generator`); ``"dense"`` batches equal lengths only, so that no prompt token runs as a decode step.
    """
    if not (isinstance(batch_size, int) and batch_size >= 1):
        raise ValueError(f"batch_size: must be an int >= 1, got {batch_size!r}")
    if not (isinstance(length_spread, int) and length_spread >= 0):
        raise ValueError(f"length_spread: must be an int >= 0, got {length_spread!r}")
    if prefill not in PREFILL_MODES:
        raise ValueError(f"prefill: must be one of {', '.join(PREFILL_MODES)}, got {prefill!r}")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("prompts: every prompt needs at least one token")
    vocab = model.config.get_text_config().vocab_size
    bad = next((i for i, p in enumerate(prompts) if min(p) < 0 or max(p) >= vocab), None)
    if bad is not None:
        raise ValueError(f"prompts: prompt {bad} has token ids outside [0, {vocab})")
    runtime = getattr(model, "wide_runtime", None)
    if (runtime is not None and getattr(runtime, "coherent", None)) or prefill == "dense":
        length_spread = 0
    device = next(model.parameters()).device
    cache_len = max((len(p) for p in prompts), default=1) + max_new_tokens
    gens: dict[int, Generator] = {}
    stop = set(stop_ids)
    eos = list(stop_ids) or None
    out: list[Optional[list[int]]] = [None] * len(prompts)
    done = 0
    for rows in _batches([len(p) for p in prompts], batch_size, length_spread):
        size = min(batch_size, 1 << (len(rows) - 1).bit_length())  # a power of two (or the full batch)
        rows_in = rows + [rows[-1]] * (size - len(rows))
        short = len(prompts[rows[0]])
        extra = len(prompts[rows[-1]]) - short  # the batch's longest prompt past its shortest
        ids = torch.tensor([list(prompts[i][:short]) for i in rows_in], dtype=torch.long, device=device)
        tails = None
        if extra:
            rest = [list(prompts[i][short:]) for i in rows_in]
            tails = (torch.tensor([r + [0] * (extra - len(r)) for r in rest], dtype=torch.long, device=device),
                     torch.tensor([len(r) for r in rest], dtype=torch.long, device=device))
        gen = gens.get(size)
        if gen is None:
            gen = gens[size] = Generator(model, batch_size=size, max_cache_len=cache_len, graphs=graphs,
                                         prefill=prefill)
        rng = None
        if temperature > 0:
            rng = torch.Generator(device=device)
            rng.manual_seed(seed * 1_000_003 + rows[0])
        full = gen.generate(ids, max_new_tokens=max_new_tokens + extra, eos_token_id=eos, temperature=temperature,
                            generator=rng, tails=tails).tolist()
        for i, tokens in zip(rows, full):
            n = len(prompts[i])
            out[i] = cut_at_stop(tokens[n:n + max_new_tokens], stop, keep=False)
        done += len(rows)
        if progress is not None:
            progress(done, len(prompts))
    return out  # type: ignore[return-value]


def _batches(lengths: Sequence[int], batch_size: int, spread: int) -> list[list[int]]:
    """Prompt indices by ascending length (ties in prompt order), cut into batches of up to ``batch_size`` whose
    lengths differ by at most ``spread``."""
    batches: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: (lengths[i], i)):
        cur = batches[-1] if batches else None
        if cur is None or len(cur) == batch_size or lengths[i] - lengths[cur[0]] > spread:
            batches.append([i])
        else:
            cur.append(i)
    return batches
