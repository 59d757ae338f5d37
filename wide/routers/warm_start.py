"""Routers started from the dense model's own per-token group importance (``RouterCalibration(router_init=
"importance")``), instead of random margins.

Stage 1 begins with random routers: at the paper's budget (≈ 655M tokens) that start is forgotten, at ours (a few
million) it is not. This fits each linear router, before the first step, to predict how much each of its groups
contributes for each token, from what it reads (the pre-norm residual, RMS-normalised as the router sees it):

* the dense model runs a few batches (every group executed, no grad); a group's contribution for a token is the norm
  of its part of the sub-layer's output, ``‖W_out[:, g] · a_g‖`` (``o_proj`` over the group's heads, ``down_proj``
  over its channels), in log space;
* a ridge regression from the router's input to the log contributions (sufficient statistics, so it streams and
  sums over data-parallel ranks) gives a ``[D, G]`` map, divided by the contributions' spread: the margin, higher
  where a group's predicted contribution is larger;
* a linear router takes the map as is; a low-rank router takes its best rank-``r`` factors (SVD), its spare rank
  (``r > G``) keeps its random rows with zero output weights, so they can still learn;
* a second pass over the same batches puts each router's threshold at its target share of its own margins, so it
  starts at its target rate on that data, skipping the groups predicted to matter least.

Training then goes on as usual (Gumbel noise, the sparsity term, the end-of-fit rate calibration). What this buys in
quality per token is measured, not assumed: `recipes/ablations/router_init_qwen2.5-1.5b.yaml`, then QUALITY.md. Written here because no library fits
per-token group-importance predictors for a routed Hugging Face model (Deja Vu's predictors train on recorded
activation norms; this solves the linear least-squares problem in closed form instead).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Optional

import torch
from torch import nn

from wide.modeling.architectures import get_path

SUPPORTED = ("LinearRouter", "LowRankRouter")
"""Router classes this fits (by class name: a subclass with another ``forward`` is not a linear map)."""

BINS, LOW, HIGH = 8192, -20.0, 20.0
"""The histogram of a router's margins its skip threshold is read from (bins of 0.005). Counts sum exactly over
data-parallel ranks, so any world size finds the same threshold."""


def histogram(values: torch.Tensor) -> torch.Tensor:
    """``BINS`` float64 counts of ``values`` over [`LOW`, `HIGH`]; values past the range count in the end bins."""
    edge = HIGH - (HIGH - LOW) / BINS / 2  # histc drops values past its range
    return torch.histc(values.float().clamp(LOW, edge), bins=BINS, min=LOW, max=HIGH).double()


def _all_reduce(*tensors: torch.Tensor) -> None:
    """Sums ``tensors`` in place over data-parallel ranks (no-op without an initialised process group)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        for t in tensors:
            dist.all_reduce(t)


@dataclass
class _Stats:
    """Sufficient statistics of one router's regression (float64)."""

    d: int
    g: int
    n: float = 0.0
    sx: Optional[torch.Tensor] = None
    sxx: Optional[torch.Tensor] = None
    sy: Optional[torch.Tensor] = None
    syy: Optional[torch.Tensor] = None
    sxy: Optional[torch.Tensor] = None

    def add(self, x: torch.Tensor, y: torch.Tensor) -> None:
        x, y = x.double(), y.double()
        if self.sx is None:
            dev = x.device
            self.sx = torch.zeros(self.d, dtype=torch.float64, device=dev)
            self.sxx = torch.zeros(self.d, self.d, dtype=torch.float64, device=dev)
            self.sy = torch.zeros(self.g, dtype=torch.float64, device=dev)
            self.syy = torch.zeros(self.g, dtype=torch.float64, device=dev)
            self.sxy = torch.zeros(self.d, self.g, dtype=torch.float64, device=dev)
        self.n += x.shape[0]
        self.sx += x.sum(0)
        self.sxx += x.T @ x
        self.sy += y.sum(0)
        self.syy += (y * y).sum(0)
        self.sxy += x.T @ y

    def all_reduce(self) -> None:
        """Sums the statistics over data-parallel ranks."""
        n = torch.tensor([self.n], dtype=torch.float64, device=self.sx.device)
        _all_reduce(n, self.sx, self.sxx, self.sy, self.syy, self.sxy)
        self.n = float(n.item())


@dataclass
class Fit:
    """One router's warm start: the margin map ``x @ weight + bias`` (``[D, G]``, ``[G]``) over its normalised
    input, the share of its targets' variance the map explains, and the tokens it saw."""

    weight: torch.Tensor
    bias: torch.Tensor
    r2: float
    tokens: int


def _contributions(a: torch.Tensor, w_out: torch.Tensor, units: int, chunk: int = 256) -> torch.Tensor:
    """``[N, G]`` norms of each group's part of ``a @ w_out.T`` (``a [N, I]``, ``w_out [D, I]``, ``G = I / units``)."""
    n, i = a.shape
    g = i // units
    w = w_out.float().view(w_out.shape[0], g, units)
    out = torch.empty(n, g, dtype=torch.float32, device=a.device)
    for s in range(0, n, chunk):
        part = a[s:s + chunk].float().view(-1, g, units)
        out[s:s + chunk] = torch.einsum("ngu,dgu->ngd", part, w).norm(dim=-1)
    return out


def check_supported(model: nn.Module) -> None:
    """Raises ``ValueError`` naming ``router_init`` when some router of ``model`` cannot be warm-started."""
    from wide.modeling.wrap import runtime_of

    for wl in runtime_of(model).layers:
        for kind, slot in wl.slots.items():
            router = wl.routers[kind]
            if type(router).__name__ not in SUPPORTED:
                raise ValueError(f"router_init: 'importance' fits linear routers ({', '.join(SUPPORTED)}); layer "
                                 f"{wl.layer_idx}'s {kind} router is {type(router).__name__}")
            if tuple(slot.gates) not in (("attn",), ("ffn",)) or not slot.group_size:
                raise ValueError(f"router_init: 'importance' needs width routing (one gated sub-layer, groups of "
                                 f"heads or channels); layer {wl.layer_idx}'s {kind} slot gates {slot.gates} with "
                                 f"group size {slot.group_size}")


class _DensePass:
    """Runs batches through the routed model with every group executed, handing each router's input to
    ``on_input(layer, kind, residual)`` (the one mechanism of both passes: each `WideLayer`'s ``_decide`` is shadowed
    for the pass); ``keep`` flattens a ``[B, T, C]`` tensor of the batch to its real tokens."""

    def __init__(self, model: nn.Module, on_input) -> None:
        from wide.modeling.wrap import runtime_of

        self.model, self.on_input = model, on_input
        self.layers = runtime_of(model).layers
        self.rows: Optional[torch.Tensor] = None

    def keep(self, t: torch.Tensor) -> torch.Tensor:
        flat = t.reshape(-1, t.shape[-1])
        return flat if self.rows is None else flat[self.rows]

    @torch.no_grad()
    def run(self, batches: Iterable[dict], max_tokens: Optional[int] = None) -> int:
        """The tokens run (every batch's, or until ``max_tokens``)."""
        for wl in self.layers:
            def decide(kind, residual, wl=wl):
                self.on_input(wl, kind, residual)
                return torch.ones(*residual.shape[:2], wl.slots[kind].num_groups, device=residual.device)

            wl._decide = decide  # an instance attribute: shadows the method until removed below
        seen = 0
        try:
            for batch in batches:
                ids, mask = batch["input_ids"], batch.get("attention_mask")
                self.rows = None if mask is None else mask.reshape(-1).bool().to(ids.device)
                self.model(input_ids=ids, attention_mask=mask, logits_to_keep=1)  # the head's logits are not needed
                seen += int(ids.numel() if mask is None else mask.sum())
                if max_tokens is not None and seen >= max_tokens:
                    break
        finally:
            for wl in self.layers:
                wl.__dict__.pop("_decide", None)
        return seen


def collect(model: nn.Module, batches: Iterable[dict], max_tokens: int) -> dict[tuple[int, str], _Stats]:
    """Runs ``batches`` (model inputs: ``input_ids`` and optionally ``attention_mask``) through ``model`` with every
    group executed until ``max_tokens`` tokens are seen, and returns each router's regression statistics, keyed by
    ``(layer index, kind)``."""
    check_supported(model)
    arch = getattr(model, "wide_arch", None) or getattr(getattr(model, "base_model", None), "wide_arch", None)
    layers = {getattr(layer, "wide", None): layer for layer in get_path(model, arch.layers)}
    stats: dict[tuple[int, str], _Stats] = {}
    pending: dict[tuple[int, str], torch.Tensor] = {}

    def on_input(wl, kind, residual):  # what the router reads, until its sub-layer's output projection runs
        pending[(wl.layer_idx, kind)] = run.keep(wl.routers[kind]._input(residual).float())

    run = _DensePass(model, on_input)
    handles = []
    for wl in run.layers:
        layer = layers[wl]
        outs = {"attn": get_path(get_path(layer, arch.attn), arch.o_proj),
                "ffn": get_path(get_path(layer, arch.mlp), arch.down_proj)}
        for kind, slot in wl.slots.items():
            stats[(wl.layer_idx, kind)] = _Stats(wl.routers[kind].spec.hidden_size, slot.num_groups)
            out = outs[slot.gates[0]]

            def hook(module, args, key=(wl.layer_idx, kind), units=out.in_features // slot.num_groups):
                x = pending.pop(key, None)
                if x is not None:
                    y = torch.log(_contributions(run.keep(args[0]), module.weight, units) + 1e-8)
                    stats[key].add(x, y)

            handles.append(out.register_forward_pre_hook(hook))
    try:
        seen = run.run(batches, max_tokens)
    finally:
        for h in handles:
            h.remove()
    if seen == 0:
        raise ValueError("router_init: 'importance' read no training tokens (the training data gave no batch)")
    for s in stats.values():
        s.all_reduce()
    return stats


def solve(s: _Stats, ridge: float = 1e-3) -> Fit:
    """The margin map of one router from its statistics: ridge regression of the log contributions on the input,
    divided by their spread (its threshold is set by `warm_start`'s second pass)."""
    n = max(s.n, 1.0)
    mx, my = s.sx / n, s.sy / n
    cov = s.sxx / n - torch.outer(mx, mx)
    cross = s.sxy / n - torch.outer(mx, my)
    lam = ridge * max(float(torch.trace(cov)) / s.d, 1e-12)
    eye = torch.eye(s.d, dtype=cov.dtype, device=cov.device)
    w = torch.linalg.solve(cov + lam * eye, cross)  # [D, G]
    b = my - mx @ w
    # explained variance, from the same statistics: residual = y - x w - b per group
    var_y = s.syy / n - my * my
    fitted = (w * (cov @ w)).sum(0)  # Var(x w) per group
    r2 = float(1.0 - ((var_y - 2 * (w * cross).sum(0) + fitted).clamp_min(0).sum() / var_y.sum().clamp_min(1e-12)))
    spread = math.sqrt(max(float((s.syy.sum() / (n * s.g)) - (s.sy.sum() / (n * s.g)) ** 2), 1e-12))
    return Fit(weight=(w / spread).float(), bias=(b / spread).float(), r2=r2, tokens=int(s.n))


def quantile(hist: torch.Tensor, q: float) -> float:
    """The ``q`` quantile of the values counted in ``hist`` (`BINS` bins over [`LOW`, `HIGH`]), linear inside a bin."""
    cdf = torch.cumsum(hist.double().cpu(), 0)
    total = float(cdf[-1])
    if total <= 0:
        return 0.0
    want = q * total
    i = int(torch.searchsorted(cdf, torch.tensor([want], dtype=torch.float64)).clamp_max(BINS - 1))
    below = float(cdf[i - 1]) if i > 0 else 0.0
    inside = float(hist[i])
    frac = (want - below) / inside if inside > 0 else 0.0
    width = (HIGH - LOW) / BINS
    return LOW + (i + min(max(frac, 0.0), 1.0)) * width


@torch.no_grad()
def apply_fit(router: nn.Module, fit: Fit) -> None:
    """Writes ``fit``'s margins into ``router`` (execute logit ``+m/2``, skip logit ``-m/2``)."""
    w, b = fit.weight, fit.bias  # [D, G], [G]
    name = type(router).__name__
    if name == "LinearRouter":
        p = router.proj
        p.weight[0::2] = (w.T / 2).to(p.weight)
        p.weight[1::2] = (-w.T / 2).to(p.weight)
        p.bias[0::2] = (b / 2).to(p.bias)
        p.bias[1::2] = (-b / 2).to(p.bias)
        return
    if name != "LowRankRouter":
        raise ValueError(f"router_init: cannot warm-start a {name}")
    down, up = router.down, router.up
    r = down.weight.shape[0]
    u, sv, vh = torch.linalg.svd(w.double(), full_matrices=False)  # w ≈ u diag(sv) vh
    k = min(r, sv.numel())
    root = sv[:k].sqrt()
    down.weight[:k] = (u[:, :k] * root).T.to(down.weight)
    a = (root[:, None] * vh[:k]).T  # [G, k]
    up.weight.zero_()
    up.weight[0::2, :k] = (a / 2).to(up.weight)
    up.weight[1::2, :k] = (-a / 2).to(up.weight)
    up.bias[0::2] = (b / 2).to(up.bias)
    up.bias[1::2] = (-b / 2).to(up.bias)


def margin_histograms(model: nn.Module, batches: Iterable[dict]) -> dict[tuple[int, str], torch.Tensor]:
    """Each router's execute margins over ``batches`` (every group executed), as `histogram` counts summed over
    data-parallel ranks."""
    hists: dict[tuple[int, str], torch.Tensor] = {}

    def on_input(wl, kind, residual):
        m = run.keep(wl.routers[kind].execute_margin(residual).reshape(*residual.shape[:2], -1))
        key = (wl.layer_idx, kind)
        hists[key] = hists[key] + histogram(m) if key in hists else histogram(m)

    run = _DensePass(model, on_input)
    run.run(batches)
    _all_reduce(*hists.values())
    return hists


def warm_start(model: nn.Module, batches: Iterable[dict], max_tokens: int,
               ridge: float = 1e-3) -> dict[tuple[int, str], Fit]:
    """Fits every router of ``model`` to its groups' importance over ``batches`` (up to ``max_tokens`` tokens) and
    writes the result into the routers. Returns the fits (``r2``: how much of the importance each explains).

    A second pass over the same batches sets each router's skip threshold on its own margins, so at the start each
    skips its target share of (token, group) pairs on that data (within a histogram bin)."""
    from wide.modeling.wrap import runtime_of
    from wide.routers.base import shift_execute_margin

    used: list[dict] = []

    def keep_used():
        for batch in batches:
            used.append(batch)
            yield batch

    stats = collect(model, keep_used(), max_tokens)
    fits = {}
    layers = runtime_of(model).layers
    for wl in layers:
        for kind in wl.slots:
            router = wl.routers[kind]
            fit = solve(stats[(wl.layer_idx, kind)], ridge)
            apply_fit(router, fit)
            fits[(wl.layer_idx, kind)] = fit
    hists = margin_histograms(model, used)
    for wl in layers:
        for kind in wl.slots:
            router, fit = wl.routers[kind], fits[(wl.layer_idx, kind)]
            tau = quantile(hists[(wl.layer_idx, kind)], min(max(router.spec.target_sparsity, 0.0), 1.0))
            shift_execute_margin(router, -tau)
            fit.bias = fit.bias - tau
    return fits
