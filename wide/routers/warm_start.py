"""Routers started from the dense model's own per-token group importance (``RouterCalibration(router_init=
"importance")``), instead of random margins.

Stage 1 begins with random routers: at the paper's budget (≈ 655M tokens) that start is forgotten, at ours (a few
million) it is not. This fits each linear router, before the first step, to predict how much each of its groups
contributes for each token, from what it reads (the pre-norm residual, RMS-normalised as the router sees it):

* the dense model runs a few batches (every group executed, no grad); a group's contribution for a token is the norm
  of its part of the sub-layer's output, ``‖W_out[:, g] · a_g‖`` (``o_proj`` over the group's heads, ``down_proj``
  over its channels), in log space;
* a ridge regression from the router's input to the log contributions (sufficient statistics, so it streams and
  sums over data-parallel ranks) gives a ``[D, G]`` map; its margin is that prediction minus the contribution at the
  router's target skip rate (the quantile over all tokens and groups), over its spread, so at the start a group is
  skipped where its predicted contribution is among the smallest;
* a linear router takes the map as is; a low-rank router takes its best rank-``r`` factors (SVD), its spare rank
  (``r > G``) keeps its random rows with zero output weights, so they can still learn;
* a second pass over the same batches moves each router's threshold to its target share of its own margins (the
  fitted predictions are narrower than the contributions), so it starts at its target rate on that data.

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
"""The histogram of log contributions a router's skip threshold is read from (bins of 0.005 in log space: the
threshold within 0.5% of the exact quantile's contribution). Counts sum exactly over data-parallel ranks, so any
world size finds the same threshold."""


@dataclass
class _Stats:
    """Sufficient statistics of one router's regression (float64), and a sample of its targets."""

    d: int
    g: int
    n: float = 0.0
    sx: Optional[torch.Tensor] = None
    sxx: Optional[torch.Tensor] = None
    sy: Optional[torch.Tensor] = None
    syy: Optional[torch.Tensor] = None
    sxy: Optional[torch.Tensor] = None
    hist: Optional[torch.Tensor] = None

    def add(self, x: torch.Tensor, y: torch.Tensor) -> None:
        x, y = x.double(), y.double()
        if self.sx is None:
            dev = x.device
            self.sx = torch.zeros(self.d, dtype=torch.float64, device=dev)
            self.sxx = torch.zeros(self.d, self.d, dtype=torch.float64, device=dev)
            self.sy = torch.zeros(self.g, dtype=torch.float64, device=dev)
            self.syy = torch.zeros(self.g, dtype=torch.float64, device=dev)
            self.sxy = torch.zeros(self.d, self.g, dtype=torch.float64, device=dev)
            self.hist = torch.zeros(BINS, dtype=torch.float64, device=dev)
        self.n += x.shape[0]
        self.sx += x.sum(0)
        self.sxx += x.T @ x
        self.sy += y.sum(0)
        self.syy += (y * y).sum(0)
        self.sxy += x.T @ y
        edge = HIGH - (HIGH - LOW) / BINS / 2  # histc drops values past its range: clamp them into the end bins
        self.hist += torch.histc(y.float().clamp(LOW, edge), bins=BINS, min=LOW, max=HIGH).double()

    def all_reduce(self) -> None:
        """Sums the statistics over data-parallel ranks (no-op without an initialised process group)."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return
        n = torch.tensor([self.n], dtype=torch.float64, device=self.sx.device)
        for t in (n, self.sx, self.sxx, self.sy, self.syy, self.sxy, self.hist):
            dist.all_reduce(t)
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


def _router_input(router: nn.Module, residual: torch.Tensor) -> torch.Tensor:
    return router._input(residual).float()


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


@torch.no_grad()
def collect(model: nn.Module, batches: Iterable[dict], max_tokens: int) -> dict[tuple[int, str], _Stats]:
    """Runs ``batches`` (model inputs: ``input_ids`` and optionally ``attention_mask``) through ``model`` with every
    group executed until ``max_tokens`` tokens are seen, and returns each router's regression statistics, keyed by
    ``(layer index, kind)``."""
    from wide.modeling.wrap import runtime_of

    check_supported(model)
    runtime = runtime_of(model)
    arch = getattr(model, "wide_arch", None) or getattr(getattr(model, "base_model", None), "wide_arch", None)
    layers = {getattr(layer, "wide", None): layer for layer in get_path(model, arch.layers)}
    stats: dict[tuple[int, str], _Stats] = {}
    pending: dict[tuple[int, str], torch.Tensor] = {}
    valid: dict[str, Optional[torch.Tensor]] = {"rows": None}
    handles, patched = [], []

    def keep(t: torch.Tensor) -> torch.Tensor:  # [B, T, C] -> [N, C], real tokens only
        flat = t.reshape(-1, t.shape[-1])
        return flat if valid["rows"] is None else flat[valid["rows"]]

    for wl in runtime.layers:
        layer = layers[wl]
        for kind, slot in wl.slots.items():
            router = wl.routers[kind]
            stats[(wl.layer_idx, kind)] = _Stats(router.spec.hidden_size, slot.num_groups)
        by_gate = {slot.gates[0]: kind for kind, slot in wl.slots.items()}

        def decide(kind, residual, wl=wl):  # the router's input; every group runs
            pending[(wl.layer_idx, kind)] = keep(_router_input(wl.routers[kind], residual))
            return torch.ones(*residual.shape[:2], wl.slots[kind].num_groups, device=residual.device)

        wl._decide = decide  # an instance attribute: shadows the method until removed below
        patched.append(wl)
        outs = {"attn": get_path(get_path(layer, arch.attn), arch.o_proj),
                "ffn": get_path(get_path(layer, arch.mlp), arch.down_proj)}
        for gate, kind in by_gate.items():
            units = outs[gate].in_features // wl.slots[kind].num_groups  # input columns of one group

            def hook(module, args, key=(wl.layer_idx, kind), units=units):
                x = pending.pop(key, None)
                if x is None:
                    return
                y = torch.log(_contributions(keep(args[0]), module.weight, units) + 1e-8)
                stats[key].add(x, y)

            handles.append(outs[gate].register_forward_pre_hook(hook))
    seen = 0
    try:
        for batch in batches:
            ids = batch["input_ids"]
            mask = batch.get("attention_mask")
            valid["rows"] = None if mask is None else mask.reshape(-1).bool().to(ids.device)
            model(input_ids=ids, attention_mask=mask, logits_to_keep=1)  # the head's logits are not needed
            seen += int(ids.numel() if mask is None else mask.sum())
            if seen >= max_tokens:
                break
    finally:
        for h in handles:
            h.remove()
        for wl in patched:
            del wl._decide
        pending.clear()
    if seen == 0:
        raise ValueError("router_init: 'importance' read no training tokens (the training data gave no batch)")
    for s in stats.values():
        s.all_reduce()
    return stats


def solve(s: _Stats, target: float, ridge: float = 1e-3) -> Fit:
    """The margin map of one router from its statistics: ridge regression of the log contributions on the input,
    shifted by the ``target`` quantile of the contributions and divided by their spread."""
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
    tau = quantile(s.hist, min(max(target, 0.0), 1.0))
    spread = math.sqrt(max(float((s.syy.sum() / (n * s.g)) - (s.sy.sum() / (n * s.g)) ** 2), 1e-12))
    return Fit(weight=(w / spread).float(), bias=((b - tau) / spread).float(), r2=r2, tokens=int(s.n))


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


@torch.no_grad()
def margin_histograms(model: nn.Module, batches: list[dict]) -> dict[tuple[int, str], torch.Tensor]:
    """Each router's execute margins over ``batches`` (every group executed), as `BINS`-bin histograms summed over
    data-parallel ranks."""
    from wide.modeling.wrap import runtime_of

    runtime = runtime_of(model)
    hists: dict[tuple[int, str], torch.Tensor] = {}
    valid: dict[str, Optional[torch.Tensor]] = {"rows": None}
    edge = HIGH - (HIGH - LOW) / BINS / 2
    for wl in runtime.layers:
        def decide(kind, residual, wl=wl):
            g = wl.slots[kind].num_groups
            m = wl.routers[kind].execute_margin(residual).reshape(-1, g)
            m = m if valid["rows"] is None else m[valid["rows"]]
            h = torch.histc(m.float().clamp(LOW, edge), bins=BINS, min=LOW, max=HIGH).double()
            key = (wl.layer_idx, kind)
            hists[key] = hists[key] + h if key in hists else h
            return torch.ones(*residual.shape[:2], g, device=residual.device)

        wl._decide = decide
    try:
        for batch in batches:
            mask = batch.get("attention_mask")
            valid["rows"] = None if mask is None else mask.reshape(-1).bool().to(batch["input_ids"].device)
            model(input_ids=batch["input_ids"], attention_mask=mask, logits_to_keep=1)
    finally:
        for wl in runtime.layers:
            wl.__dict__.pop("_decide", None)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        for h in hists.values():
            dist.all_reduce(h)
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
            fit = solve(stats[(wl.layer_idx, kind)], router.spec.target_sparsity, ridge)
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
