"""Greedy generation with every decode step replayed from one CUDA graph.

HF ``generate`` runs decode steps eagerly unless it compiles the whole forward; a routed model's ops are
graph breaks there, so an eager step stays bound by the host issuing ~40 launches per layer (an 8B-shaped
batch-1 step: ≈ 24 ms eager against ≈ 6 ms replayed on an H200). ``generate`` here prefills eagerly into a
``StaticCache``, runs the first decode step eagerly (it compiles the kernels and makes their buffers), captures
the next one and replays that graph for every later token: the token and its position live in fixed device
buffers updated in place, the static cache advances its own write position on the device, and the routed
kernels read masks, plans and lengths on the device, so nothing is re-issued from the host. Without CUDA (or
with ``graphs=False``) the same loop runs eagerly.

Greedy decoding of unpadded batches (every row as long as the others), which is what the speed numbers in
BENCHMARKS.md time; sampling, padding and stopping strings stay with HF ``generate``.
"""

from __future__ import annotations

import warnings
from typing import Optional

import torch
from torch import nn


def _check(model: nn.Module, input_ids, max_new_tokens: int, eos_token_id, max_cache_len: Optional[int],
           check_every: int) -> None:
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.dtype != torch.long:
        raise ValueError("input_ids: must be an int64 tensor [B, T] of unpadded rows, got "
                         f"{type(input_ids).__name__} {getattr(input_ids, 'shape', '')} {getattr(input_ids, 'dtype', '')}")
    if input_ids.shape[0] < 1 or input_ids.shape[1] < 1:
        raise ValueError(f"input_ids: needs at least one row and one token, got shape {tuple(input_ids.shape)}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: must be an int >= 1, got {max_new_tokens!r}")
    dev = next(model.parameters()).device
    if input_ids.device != dev:
        raise ValueError(f"input_ids: on {input_ids.device}, the model is on {dev}")
    vocab = model.config.get_text_config().vocab_size
    if int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab:
        raise ValueError(f"input_ids: token ids must be in [0, {vocab}), got [{int(input_ids.min())}, "
                         f"{int(input_ids.max())}]")
    if eos_token_id is not None and not (isinstance(eos_token_id, int) and 0 <= eos_token_id < vocab):
        raise ValueError(f"eos_token_id: must be a token id in [0, {vocab}) or None, got {eos_token_id!r}")
    need = input_ids.shape[1] + max_new_tokens
    if max_cache_len is not None and max_cache_len < need:
        raise ValueError(f"max_cache_len: {max_cache_len} cannot hold the prompt ({input_ids.shape[1]}) and "
                         f"max_new_tokens ({max_new_tokens})")
    if not isinstance(check_every, int) or check_every < 1:
        raise ValueError(f"check_every: must be an int >= 1, got {check_every!r}")
    if model.training:
        raise ValueError("model: in training mode; call model.eval() first (routed kernels run in eval only)")


@torch.inference_mode()
def generate(model: nn.Module, input_ids: torch.Tensor, *, max_new_tokens: int, eos_token_id: Optional[int] = None,
             pad_token_id: Optional[int] = None, graphs: Optional[bool] = None,
             max_cache_len: Optional[int] = None, check_every: int = 16) -> torch.Tensor:
    """Greedy continuation of ``input_ids``, decode steps replayed from a CUDA graph (see the module docstring).

    Args:
        model: An HF causal LM in eval mode, routed (``wide.load`` / ``enable_kernels``) or dense.
        input_ids: ``[B, T]`` int64 prompt tokens, no padding, on the model's device.
        max_new_tokens: Tokens to add per row.
        eos_token_id: A row that emits it is finished: its later positions hold ``pad_token_id``; the loop
            stops once every row is finished (checked every ``check_every`` steps, one host sync each).
        pad_token_id: Filler after EOS (default: ``eos_token_id``).
        graphs: Capture and replay decode steps (default: on CUDA devices).
        max_cache_len: Static cache length (default: prompt + ``max_new_tokens``).
        check_every: Steps between EOS checks on the host.

    Returns:
        ``[B, T + n]`` int64: the prompt and ``n <= max_new_tokens`` new tokens (``n`` is smaller only when
        every row finished early).
    """
    from transformers import StaticCache

    _check(model, input_ids, max_new_tokens, eos_token_id, max_cache_len, check_every)
    dev = input_ids.device
    B, T = input_ids.shape
    graphs = dev.type == "cuda" if graphs is None else graphs
    if graphs and dev.type != "cuda":
        raise ValueError(f"graphs: CUDA graphs need a CUDA device, the model is on {dev}")
    pad = eos_token_id if pad_token_id is None else pad_token_id
    cache = StaticCache(config=model.config, max_cache_len=max_cache_len or T + max_new_tokens)
    out = torch.empty(B, T + max_new_tokens, dtype=torch.long, device=dev)
    out[:, :T] = input_ids
    logits = model(input_ids=input_ids, past_key_values=cache, use_cache=True, logits_to_keep=1,
                   cache_position=torch.arange(T, device=dev)).logits
    tok = logits[:, -1].argmax(-1, keepdim=True)  # [B, 1]: the step's input, updated in place from here on
    pos = torch.tensor([T], device=dev)
    done = torch.zeros(B, dtype=torch.bool, device=dev)

    def step():
        return model(input_ids=tok, past_key_values=cache, use_cache=True, cache_position=pos).logits

    def emit(i: int, logits: Optional[torch.Tensor]) -> None:
        """Writes token ``i`` (held in ``tok``), then the next step's input and position."""
        nonlocal done
        if eos_token_id is not None:
            out[:, T + i] = torch.where(done, torch.full_like(tok[:, 0], pad), tok[:, 0])
            done = done | (tok[:, 0] == eos_token_id)
        else:
            out[:, T + i] = tok[:, 0]
        if logits is not None:
            tok.copy_(logits[:, -1].argmax(-1, keepdim=True))
            pos.add_(1)

    graph = static_logits = None
    n = max_new_tokens
    for i in range(max_new_tokens):
        last = i == max_new_tokens - 1
        if eos_token_id is not None and i and i % check_every == 0 and bool(done.all()):
            n = i
            break
        if last:
            emit(i, None)
            break
        if graph is not None:
            graph.replay()
            emit(i, static_logits)
        elif graphs and i == 1:
            # step 0 ran eagerly (compiled the kernels, made their buffers): capture this one, then replay it
            try:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    static_logits = step()
            except Exception as err:  # noqa: BLE001 - something in the step syncs with the host: decode eagerly
                warnings.warn(f"wide.generate: the decode step could not be captured in a CUDA graph "
                              f"({type(err).__name__}: {str(err)[:200]}); decoding eagerly", stacklevel=3)
                graph, graphs = None, False
                torch.cuda.synchronize()
                emit(i, step())
                continue
            graph.replay()
            emit(i, static_logits)
        elif graphs:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                logits = step()
            torch.cuda.current_stream().wait_stream(side)
            emit(i, logits)
        else:
            emit(i, step())
    else:
        n = max_new_tokens
    return out[:, :T + n]
