"""Bandwidth floors of a decode step: the bytes it must read from device memory, and the time that takes at the
device's measured bandwidth.

A decode step at batch B reads every weight it multiplies by (once, whatever B: a row's weights are shared) and
every key / value its attention looks at. Dense: all weights of the decoder layers, ``lm_head`` and B embedding
rows, plus the cache of every KV head of every row. Routed (`decode_step_bytes` given the step's masks): the dense
K/V projections; ``q_proj`` / ``o_proj`` of the head groups and gate / up / down of the FFN groups that *some* row
of the batch executes (the routed GEMMs read the union of the rows' groups); the cache of a row's KV head only when
one of its query heads executes (`wide.kernels` decode attention skips the others); and the routers' weights. A
measured time over the floor (``bytes / bandwidth``) says how far each side is from its own best possible step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

KINDS = ("attn", "ffn")


@dataclass(frozen=True)
class StepShape:
    """The shapes a decode step's bytes follow (a decoder-only transformer, SwiGLU MLP, tied or untied ``lm_head``).

    Norm weights count; biases do not (Qwen's q/k/v biases are < 0.01% of a step's bytes).
    """

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    weight_bytes: int
    """Bytes per weight element."""
    cache_bytes: int
    """Bytes per K/V cache element."""

    @classmethod
    def of(cls, model) -> "StepShape":
        """The shape of ``model`` (an HF causal LM), its weights' and cache's element size that of its parameters."""
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        size = next(model.parameters()).element_size()
        return cls(cfg.num_hidden_layers, cfg.hidden_size, heads, getattr(cfg, "num_key_value_heads", None) or heads,
                   head_dim, cfg.intermediate_size, cfg.vocab_size, size, size)


def _rows(mask: torch.Tensor) -> torch.Tensor:
    """``[B, G]`` bool of a decode step's mask ``[B, G]`` or ``[B, 1, G]``."""
    return mask.reshape(mask.shape[0], -1).bool()


def decode_step_bytes(shape: StepShape, batch: int, keys: int, masks: Optional[dict] = None,
                      router_bytes: int = 0) -> dict[str, int]:
    """Bytes one decode step reads at its floor: ``{"weights", "kv", "router", "total"}``.

    Args:
        shape: The model's shapes.
        batch: Rows B (one new token each).
        keys: Keys every row attends to (the context, plus the new token).
        masks: ``masks[layer][kind]``: the step's execute mask ``[B, G]`` (or ``[B, 1, G]``) of ``kind`` (``attn``:
            G groups of query heads; ``ffn``: G groups of FFN channels) in decoder layer ``layer``. A layer or kind
            without one runs dense; ``None``: the dense model.
        router_bytes: The routers' weight bytes (read once a step).
    """
    d, h, hk, hd = shape.hidden, shape.heads, shape.kv_heads, shape.head_dim
    masks = masks or {}
    weights = batch * d + d + shape.vocab * d  # embedding rows, final norm, lm_head
    kv_heads_read = 0
    for i in range(shape.layers):
        m = masks.get(i, {})
        weights += 2 * d + 2 * hk * hd * d  # two norms, dense K/V projections
        attn = m.get("attn")
        if attn is None:
            weights += 2 * h * hd * d
            kv_heads_read += batch * hk
        else:
            rows = _rows(attn)
            heads = rows.repeat_interleave(h // rows.shape[-1], dim=-1)  # [B, H] (one group of all heads: G = 1)
            weights += 2 * int(heads.any(0).sum()) * hd * d
            kv_heads_read += int(heads.reshape(rows.shape[0], hk, h // hk).any(-1).sum())
        ffn = m.get("ffn")
        groups = 1.0 if ffn is None else float(_rows(ffn).any(0).float().mean())
        weights += round(3 * shape.intermediate * d * groups)
    weights *= shape.weight_bytes
    kv = kv_heads_read * 2 * keys * hd * shape.cache_bytes
    return {"weights": weights, "kv": kv, "router": router_bytes, "total": weights + kv + router_bytes}


def step_masks(model) -> dict:
    """The last forward's execute masks as `decode_step_bytes` takes them (after a graph replay: the replay's)."""
    import wide

    out: dict = {}
    for (layer, kind), mask in wide.modeling.runtime_of(model).last_masks().items():
        out.setdefault(layer, {})[kind] = mask.detach()
    return out


def router_bytes(model) -> int:
    """Bytes of the routers' parameters (a decode step reads them all)."""
    import wide

    return sum(p.numel() * p.element_size() for wl in wide.modeling.runtime_of(model).layers
               for p in wl.routers.parameters())


def measure_bandwidth(device, gib: float = 2.0, iters: int = 10) -> Optional[dict]:
    """The device memory bandwidth in bytes/s, best of ``iters``, or ``None`` off CUDA.

    Two measures over a ``gib`` GiB buffer (far past the L2), each timed with CUDA events: a device-to-device copy
    (read + write: twice the buffer's bytes) and a read-only sum; ``bandwidth`` is the higher (the floor it gives is
    a lower bound either way).
    """
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    with torch.cuda.device(device):  # the events time the current stream of the measured device
        return _measure(device, gib, iters)


def _measure(device: torch.device, gib: float, iters: int) -> dict:
    n = int(gib * 2 ** 30) // 4
    x = torch.ones(n, dtype=torch.float32, device=device)
    y = torch.empty_like(x)

    def best(fn) -> float:
        fn()
        times = []
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return min(times)

    nbytes = x.numel() * x.element_size()
    copy = 2 * nbytes / best(lambda: y.copy_(x))
    read = nbytes / best(lambda: x.sum())
    del x, y
    torch.cuda.empty_cache()
    return {"bandwidth": max(copy, read), "copy": copy, "read": read, "gib": gib, "iters": iters}


def floor_fields(side: str, nbytes: dict, measured_ms: float, bandwidth: Optional[dict]) -> dict:
    """A decode row's fields for one side (``dense`` / ``routed``): the bytes read, and without a measured bandwidth
    (off CUDA) ``None`` for the floor ms and measured / floor."""
    floor = None if bandwidth is None else nbytes["total"] / bandwidth["bandwidth"] * 1e3
    return {f"{side}_bytes": nbytes, f"{side}_floor_ms": floor,
            f"{side}_of_floor": None if floor is None else measured_ms / floor}
