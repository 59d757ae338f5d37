"""Synthetic masks for the bench: ``random`` routers set to a rate, or untrained linear / low-rank routers whose
execute biases are calibrated to it (a trained router's kernels and launches, at a chosen rate)."""

from __future__ import annotations

import torch


def set_synthetic_rate(model, router: str, sparsity: float, tokens: int = 512) -> None:
    """Make the bench's synthetic routers skip ``sparsity``: ``random`` routers take it as their rate, untrained
    linear / low-rank ones get their execute biases calibrated to it (`calibrate_routers`)."""
    import wide

    if router == "random":
        for wl in wide.modeling.runtime_of(model).layers:
            for r in wl.routers.values():
                r.rate = sparsity
    else:
        calibrate_routers(model, sparsity, tokens=tokens)


@torch.no_grad()
def calibrate_routers(model, sparsity: float, tokens: int = 512, passes: int = 2, seed: int = 0) -> None:
    """Make untrained linear / low-rank routers skip ``sparsity`` of their (token, group) pairs (bench only).

    `wide bench --router lowrank` times the router a trained model would run (its kernels and launches), with
    random weights: each router's execute margin is shifted (`wide.routers.base.shift_execute_margin`) by the
    ``sparsity`` quantile of its margins per group, over the residual streams of one prompt of ``tokens`` random
    ids, or text when the bench times text (``passes`` times, as each layer's input depends on the routers before
    it), and its expected rate (the kernels' density hint) set to ``sparsity``. The rates it then realizes are the bench's "realized" columns.
    Every group at the rate suits random routers; a trained model keeps its learned split and gets one shift for
    all routers instead (`wide.modeling.rate.fit_rate`).
    """
    import dataclasses

    import wide
    from wide.routers.base import shift_execute_margin

    layers = wide.modeling.runtime_of(model).layers
    routers = [(i, k, r) for i, wl in enumerate(layers) for k, r in wl.routers.items()]
    for _, _, r in routers:
        if r.logit_bias() is None:
            raise ValueError(f"--router: {type(r).__name__} has no logit bias to calibrate "
                             "(linear / lowrank / mlp / static)")
        r.spec = dataclasses.replace(r.spec, target_sparsity=float(sparsity))
    device = next(model.parameters()).device
    from wide.bench.models import TEXT_ATTR, bench_ids

    if getattr(model, TEXT_ATTR, None) is not None:  # the bench times text: calibrate on the same stream
        ids = bench_ids(model, (1, tokens), device)
    else:
        gen = torch.Generator(device="cpu").manual_seed(seed)
        ids = torch.randint(0, model.config.vocab_size, (1, tokens), generator=gen).to(device)
    for _ in range(passes):
        seen: dict = {}
        for i, k, r in routers:
            real = type(r).execute_decision

            def record(hidden, backend="torch", margin=False, _r=r, _real=real, _key=(i, k)):
                if _key not in seen:
                    seen[_key] = hidden.reshape(-1, hidden.shape[-1]).clone()
                return _real(_r, hidden, backend=backend, margin=margin)

            r.execute_decision = record  # this instance only, for one forward
        try:
            model(input_ids=ids, use_cache=False)
        finally:
            for _, _, r in routers:
                del r.execute_decision
        for i, k, r in routers:
            if (i, k) not in seen:
                continue
            m = r.execute_decision(seen[(i, k)], margin=True).float()  # [tokens, G]
            q = torch.quantile(m, float(sparsity), dim=0) if sparsity > 0 else m.amin(0) - 1.0
            shift_execute_margin(r, -q)

