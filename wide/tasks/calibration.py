"""Stage 1: router calibration with the backbone frozen."""

from __future__ import annotations

from typing import Any, Optional

from wide.config import WideConfig
from wide.io.loading import DEFAULT_MODEL
from wide.tasks.base import WideTask

ROUTER_INITS = ("random", "importance")
WARM_ROUTERS = ("lowrank", "linear")
"""Registered routers `wide.routers.warm_start` fits (linear maps of the residual)."""


class RouterCalibration(WideTask):
    """Trains only the routers (backbone frozen) with ``LM + lam * |target - realized skip rate|``.

    Takes ``WideTask``'s arguments (default learning rate 2e-3), and:

    Args:
        router_init: How the routers start. ``random``: their own initialisation (the paper's). ``importance``:
            before the first step, each is fitted to predict its groups' per-token contribution in the dense model
            and to skip, at its target rate, the groups predicted to matter least (`wide.routers.warm_start`; linear
            and low-rank routers, width granularity, one device or DDP). A resumed run keeps its trained routers.
        router_init_tokens: Training tokens the ``importance`` fit reads (over all data-parallel ranks).
    """

    stage = "calibrate"

    def __init__(self, model: str = DEFAULT_MODEL, routing: Optional[WideConfig] = None, router_init: str = "random",
                 router_init_tokens: int = 65536, **kwargs: Any):
        super().__init__(model, routing, **kwargs)  # the other WideTask arguments pass through
        check_router_init(self.routing, router_init, router_init_tokens)
        self.router_init = router_init
        self.router_init_tokens = router_init_tokens

    def on_fit_start(self) -> None:
        super().on_fit_start()
        warm_start_routers(self)


def check_router_init(routing: WideConfig, router_init: str, router_init_tokens: int) -> None:
    """The ``router_init`` / ``router_init_tokens`` arguments of a task that starts its own routers (stage 1, or
    stage 2 without a router checkpoint); raises ``ValueError`` naming the bad one, before any model load."""
    if router_init not in ROUTER_INITS:
        raise ValueError(f"router_init: must be one of {', '.join(ROUTER_INITS)}, got {router_init!r}")
    if isinstance(router_init_tokens, bool) or not isinstance(router_init_tokens, int) or router_init_tokens < 1:
        raise ValueError(f"router_init_tokens: must be a positive integer, got {router_init_tokens!r}")
    if router_init == "importance":
        if routing.router not in WARM_ROUTERS:
            raise ValueError(f"router_init: 'importance' fits the {' and '.join(WARM_ROUTERS)} routers, not "
                             f"routing.router {routing.router!r} (set router_init: random)")
        if routing.granularity != "width":
            raise ValueError("router_init: 'importance' needs routing.granularity 'width' (groups of heads and "
                             f"channels), got {routing.granularity!r} (set router_init: random)")


def warm_start_routers(task: WideTask) -> None:
    """``router_init: importance`` at the start of ``task``'s fit (not of a resumed one): every router fitted to its
    groups' per-token contribution in the model as it stands (the dense backbone; a fresh LoRA adds nothing yet)."""
    trainer = task.trainer
    if getattr(task, "router_init", "random") != "importance" or trainer.ckpt_path is not None:
        return
    from lightning.pytorch.utilities import rank_zero_info

    from wide.routers.warm_start import warm_start

    loader = trainer.datamodule.train_dataloader() if trainer.datamodule is not None else None
    if loader is None:
        raise ValueError("router_init: 'importance' reads training batches; this fit has no datamodule")
    device = task.device

    def batches():
        for batch in loader:
            yield {k: v.to(device) for k, v in batch.items() if k in ("input_ids", "attention_mask")}

    was_training = task.model.training
    task.model.eval()
    try:
        # each rank its share: the same setting reads the same rows at any world size
        per_rank = -(-task.router_init_tokens // max(trainer.world_size, 1))
        fits = warm_start(task.model, batches(), per_rank)
    finally:
        task.model.train(was_training)
    by_kind: dict[str, list[float]] = {}
    for (_, kind), fit in fits.items():
        by_kind.setdefault(kind, []).append(fit.r2)
    tokens = max((f.tokens for f in fits.values()), default=0)
    parts = ", ".join(f"{k} {sum(v) / len(v):.2f}" for k, v in sorted(by_kind.items()))
    rank_zero_info(f"wide: routers warm-started from group importance over {tokens:,} tokens "
                   f"(variance explained, mean over layers: {parts})")
