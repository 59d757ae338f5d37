"""Per-model routing state: temperature, valid-token mask and realized-sparsity accounting.

Everything stays on the device: one forward records a handful of small tensors per routed layer and
nothing calls ``.item()``; loggers read them once per log step.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

import torch

from wide.policies.base import SUBLAYERS

if TYPE_CHECKING:
    from wide.policies.coherent import CoherentDecode


@dataclass
class SparsityStats:
    """Realized routing of the last forward.

    Attributes:
        layers: Indices of the routed decoder layers, in order.
        skip: Per kind, ``[L]`` skipped fraction of (valid token, group) units per routed layer (detached).
        skip_grad: Per kind, the same rates as differentiable tensors (straight-through in training).
        token_active: Per kind, ``[B, T, L]`` active fraction of each token's groups per routed layer.
        valid: ``[B, T]`` bool, the tokens that count (``None``: all).
        weights: Per kind, ``[L]`` routed weight elements per routed layer (attention: ``q_proj`` + ``o_proj``;
            FFN: ``gate``/``up``/``down``; K/V stay dense), for :meth:`realized_by_weight`.
    """

    layers: list[int]
    skip: dict[str, torch.Tensor]
    skip_grad: dict[str, torch.Tensor]
    token_active: dict[str, torch.Tensor]
    valid: Optional[torch.Tensor]
    weights: Optional[dict[str, torch.Tensor]] = None

    @property
    def kinds(self) -> list[str]:
        return list(self.skip)

    def realized(self, kind: Optional[str] = None, differentiable: bool = False) -> torch.Tensor:
        """Mean skip rate over routed layers for one kind, or averaged over kinds when ``kind`` is None."""
        src = self.skip_grad if differentiable else self.skip
        if kind is not None:
            return src[kind].mean()
        return torch.stack([src[k].mean() for k in src]).mean()

    def realized_by_weight(self, differentiable: bool = False) -> torch.Tensor:
        """Share of the routed weights' work skipped: each layer's and kind's skip rate weighted by its routed
        weight elements (a token skips that share of the routed multiply-adds, and a batch-1 decode step that
        share of the routed weight bytes). The training target (:meth:`realized`, the paper's) averages the
        kinds equally instead, so routers that skip attention more than the (larger) FFN skip less by weight."""
        if not self.weights:
            return self.realized(differentiable=differentiable)
        src = self.skip_grad if differentiable else self.skip
        num = sum((src[k] * self.weights[k].to(src[k].dtype)).sum() for k in self.kinds)
        den = sum(self.weights[k].sum() for k in self.kinds)
        return num / den

    def token_active_mean(self) -> torch.Tensor:
        """``[B, T]`` active fraction per token, averaged over routed layers and kinds."""
        return torch.stack([t.mean(-1) for t in self.token_active.values()]).mean(0)


@dataclass
class WideRuntime:
    """Mutable routing state shared by all routed layers of one model."""

    tau: float = 1.0
    valid: Optional[torch.Tensor] = None
    layers: list = field(default_factory=list)
    coherent: Optional["CoherentDecode"] = None
    """Batch-coherent decode settings (`wide.set_coherent_decode`), ``None``: per-token decode routing."""
    _records: dict = field(default_factory=dict)
    # per forward: what every layer would otherwise recompute from the same input (the decode step's key
    # lengths), cleared by begin_forward
    forward_cache: dict = field(default_factory=dict)
    _weights: dict = field(default_factory=dict)
    overlap_routing: bool = True
    """Routed CUDA decode steps run the attention router on a side stream while the dense K/V projections
    run (`WideLayer.route_attention`); ``False`` keeps everything on the current stream."""
    _side_streams: dict = field(default_factory=dict)
    causal_chunks: bool = False
    """Prompt chunks' 4D attention masks are plain causal masks of an unpadded batch (set by `wide.Generator`,
    which makes the chunks): the routed kernels take them without the eager check's host sync, so a chunk's
    forward can be captured in a CUDA graph."""

    _pad_src: Optional[torch.Tensor] = None
    _padded: Optional[bool] = None

    routing: bool = True
    """``False`` (inside :meth:`routing_off`): no router runs, every group executes, nothing is recorded."""

    noise_seed: Optional[int] = None
    """Seed of the routers' Gumbel noise for the current training batch (``None``: torch's global RNG)."""
    rank: int = 0
    world: int = 1
    _noise_gen: Optional[torch.Generator] = None
    _noise_state: tuple = ()

    def set_noise(self, seed: Optional[int], rank: int = 0, world: int = 1) -> None:
        """Draws the next batch's Gumbel noise from ``seed``, as for the *global* batch.

        Every rank draws the noise of all ``world`` ranks' rows and keeps its own (rank ``r`` holds global
        rows ``r, r + world, ...``, as ``DistributedSampler`` deals them), so a data-parallel run routes
        each row with exactly the noise a single process would draw for the same global batch.
        """
        self.noise_seed, self.rank, self.world = seed, rank, world
        self._noise_state = ()

    def gumbel_like(self, logits: torch.Tensor) -> Optional[torch.Tensor]:
        """Standard Gumbel noise shaped like ``logits [B, ...]`` (float32), or ``None`` without a seed."""
        if self.noise_seed is None:
            return None
        dev = logits.device
        if self._noise_gen is None or self._noise_gen.device != dev:
            self._noise_gen = torch.Generator(device=dev)
            self._noise_state = ()
        if self._noise_state != (self.noise_seed, dev):
            self._noise_gen.manual_seed(self.noise_seed)
            self._noise_state = (self.noise_seed, dev)
        full = torch.empty((logits.shape[0] * self.world, *logits.shape[1:]), device=dev, dtype=torch.float32)
        full.exponential_(generator=self._noise_gen)
        return -full.log()[self.rank::self.world]

    def side_stream(self, device: torch.device) -> Optional[torch.cuda.Stream]:
        """The stream routed layers overlap their attention router on (one per CUDA device, made on first use);
        ``None`` on other devices."""
        if device.type != "cuda":
            return None
        stream = self._side_streams.get(device)
        if stream is None:
            stream = self._side_streams[device] = torch.cuda.Stream(device)
        return stream

    @contextlib.contextmanager
    def routing_off(self):
        """Runs the model as the dense backbone: no router is called, no mask is made (every head and channel
        executes, exactly the unrouted computation) and the forward records nothing, so the stats of the last
        routed forward survive a dense one run after it (the distillation teacher, `wide.losses.teacher`)."""
        old, self.routing = self.routing, False
        try:
            yield self
        finally:
            self.routing = old

    def begin_forward(self, valid: Optional[torch.Tensor], tokens: Optional[int] = None,
                      masked: Optional[bool] = None) -> None:
        """Starts a forward over ``tokens`` new tokens per row with 2D validity ``valid`` (``None``: all valid).

        A prefill (``tokens > 1``) starts a sequence and remembers how padding can be told (see
        :meth:`padded`); ``masked`` says whether the caller passed any attention mask (a prepared 4D
        one, as ``generate`` builds for static caches, hides padding from ``valid``).
        """
        if not self.routing:
            return  # a dense forward (routing_off) keeps the routed forward's records and sequence state
        self.valid = valid
        self._records = {}
        self.forward_cache = {}
        if tokens is None or tokens > 1:
            self._pad_src = valid
            self._padded = None if (valid is not None or masked) else False

    def padded(self, decode_mask: Optional[torch.Tensor] = None) -> Optional[bool]:
        """Whether the current sequence holds padding (``None``: cannot tell).

        Decided once per sequence, on first use: from the prefill's 2D padding mask, else from a decode
        step's visibility ``decode_mask [B, S]`` (unpadded rows see a prefix of the cache). That costs
        one host sync, in the first decode step (a CUDA-graph capture comes after eager warm-up steps).
        """
        if self._padded is None:
            if self._pad_src is not None:
                self._padded = not bool(self._pad_src.all())
                self._pad_src = None
            elif decode_mask is not None:
                n = decode_mask.sum(-1, keepdim=True)
                prefix = torch.arange(decode_mask.shape[-1], device=decode_mask.device) < n
                self._padded = not bool((decode_mask == prefix).all())
        return self._padded

    def record(self, layer_idx: int, kind: str, mask: torch.Tensor) -> None:
        """Keeps one execute mask ``[B, T, G]`` (float, may carry straight-through gradient) for accounting.

        Nothing is computed here: the rates are reduced when :meth:`stats` is read, so a forward that
        nobody accounts (inference) launches no accounting kernels, and a CUDA-graph replay's stats read
        the masks the replay just wrote.
        """
        self._records[(layer_idx, kind)] = (mask, self.valid)

    def last_masks(self) -> dict[tuple[int, str], torch.Tensor]:
        """The execute masks ``[B, T, G]`` the last routed forward recorded, by (layer index, gated sub-layer)."""
        return {key: mask for key, (mask, _) in self._records.items()}

    @staticmethod
    def _rate(mask: torch.Tensor, valid: Optional[torch.Tensor]) -> torch.Tensor:
        mask = mask.float() if mask.dtype == torch.bool else mask  # eval decisions stay bool until read
        skipped = 1.0 - mask
        if valid is not None and valid.shape == mask.shape[:2]:
            w = valid.to(mask.dtype).unsqueeze(-1)
            return (skipped * w).sum() / (w.sum() * mask.shape[-1]).clamp_min(1.0)
        return skipped.mean()

    def stats(self) -> Optional[SparsityStats]:
        if not self._records:
            return None
        layers = sorted({i for i, _ in self._records})
        skip, skip_grad, active = {}, {}, {}
        for kind in SUBLAYERS:  # records are kept per gated sub-layer, whatever the policy's slots
            recs = [self._records.get((i, kind)) for i in layers]
            if any(r is None for r in recs):
                continue
            skip_grad[kind] = torch.stack([self._rate(mask, valid) for mask, valid in recs])
            skip[kind] = skip_grad[kind].detach()
            active[kind] = torch.stack([mask.detach().float().mean(-1) for mask, _ in recs], dim=-1)
        return SparsityStats(layers, skip, skip_grad, active, self.valid, self._routed_weights(layers, skip))

    def _routed_weights(self, layers: list[int], skip: dict) -> Optional[dict[str, torch.Tensor]]:
        # made once per (layers, kinds, device) and kept: a host-to-device copy every step would sync the stream
        if not skip:
            return None
        device = next(iter(skip.values())).device
        key = (tuple(layers), tuple(skip), device)
        if key not in self._weights:
            sizes = {wl.layer_idx: wl.routed_weights for wl in self.layers}
            self._weights[key] = None if not all(sizes.get(i) for i in layers) else {
                k: torch.tensor([float(sizes[i][k]) for i in layers], device=device) for k in skip}
        return self._weights[key]
