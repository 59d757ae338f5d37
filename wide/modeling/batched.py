"""Many prompts of any lengths through `wide.Generator`, which takes unpadded batches of one length.

Prompts of the same token length batch together; each group is cut into batches of up to ``batch_size`` rows,
and a short batch is filled up with copies of its last row to the next power of two, so only a few batch sizes
occur and each gets one `Generator` (its static cache and CUDA graphs are kept from one batch to the next).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable, Optional, Sequence

import torch
from torch import nn

from wide.modeling.generate import Generator, cut_at_stop

__all__ = ["generate_many"]


def generate_many(model: nn.Module, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, batch_size: int = 16,
                  stop_ids: Sequence[int] = (), temperature: float = 0.0, seed: int = 0,
                  graphs: Optional[bool] = None, progress: Optional[Callable[[int, int], None]] = None
                  ) -> list[list[int]]:
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
    """
    if not (isinstance(batch_size, int) and batch_size >= 1):
        raise ValueError(f"batch_size: must be an int >= 1, got {batch_size!r}")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("prompts: every prompt needs at least one token")
    device = next(model.parameters()).device
    cache_len = max((len(p) for p in prompts), default=1) + max_new_tokens
    groups: dict[int, list[int]] = defaultdict(list)
    for i, p in enumerate(prompts):
        groups[len(p)].append(i)
    gens: dict[int, Generator] = {}
    stop = set(stop_ids)
    eos = list(stop_ids) or None
    out: list[Optional[list[int]]] = [None] * len(prompts)
    done = 0
    for length in sorted(groups):
        members = groups[length]
        for start in range(0, len(members), batch_size):
            rows = members[start:start + batch_size]
            size = min(batch_size, 1 << (len(rows) - 1).bit_length())  # a power of two (or the full batch)
            ids = torch.tensor([list(prompts[i]) for i in rows] + [list(prompts[rows[-1]])] * (size - len(rows)),
                               dtype=torch.long, device=device)
            gen = gens.get(size)
            if gen is None:
                gen = gens[size] = Generator(model, batch_size=size, max_cache_len=cache_len, graphs=graphs)
            rng = None
            if temperature > 0:
                rng = torch.Generator(device=device)
                rng.manual_seed(seed * 1_000_003 + rows[0])
            new = gen.generate(ids, max_new_tokens=max_new_tokens, eos_token_id=eos, temperature=temperature,
                               generator=rng)[:, length:].tolist()
            for i, tokens in zip(rows, new):
                out[i] = cut_at_stop(tokens, stop, keep=False)
            done += len(rows)
            if progress is not None:
                progress(done, len(prompts))
    return out  # type: ignore[return-value]
