"""Stage 2: adapter recovery (LoRA, or a sparse / mixed adapter) on top of calibrated routers."""

from __future__ import annotations

import json
from typing import Any, Optional

from torch import nn

from wide.config import WideConfig
from wide.io.adapters import (ADAPTERS, DEFAULT_LORA_ALPHA, class_path, inject_adapter, is_adapter_name,
                              resolve_adapter)
from wide.io.checkpoint import is_router_name, load_trained, read_metadata
from wide.io.loading import DEFAULT_MODEL
from wide.tasks.base import WideTask
from wide.tasks.calibration import check_router_init, warm_start_routers

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class LoRARecovery(WideTask):
    """Loads stage-1 routers, adds a peft adapter and trains it (and, by default, the routers).

    The ``WideConfig`` comes from the router checkpoint; ``routing`` is only used when no checkpoint is
    given (training the adapter and routers from scratch).

    Args:
        router_checkpoint: Stage-1 ``.safetensors`` file (or run folder holding ``routers.safetensors``).
        adapter: Registered adapter (``wide.io.adapters``): ``lora``; ``super`` (a fixed sparse update per weight,
            peft SHiRA, on the entries of top ``sparse_score``); ``supra`` (LoRA and the sparse update sharing the
            budget); or the class path of a plug-in ``Adapter`` subclass. Every built-in one trains as many parameters
            as LoRA of rank ``lora_r`` on ``lora_targets``.
        lora_r: LoRA rank, and every adapter's budget: ``lora_r * (in + out)`` parameters per adapted matrix.
        lora_alpha: LoRA scaling numerator (``supra`` scales it with its LoRA rank, keeping ``alpha / r``).
        lora_dropout: Dropout on the LoRA branch.
        lora_targets: Module names to adapt.
        supra_lora_share: ``supra`` only: LoRA's share of the budget (rank ``round(lora_r * share)``); the sparse
            update gets the rest.
        sparse_score: ``super`` / ``supra``: how the sparse support is chosen: ``wanda`` (``|W|`` times the input
            channel's L2 norm over ``calibration_batches`` training batches) or ``magnitude`` (``|W|``).
        calibration_batches: Training batches of the ``wanda`` calibration pass, run once before the first step.
        train_routers: Keep training the routers (``False`` freezes them).
        router_init, router_init_tokens: Without a ``router_checkpoint`` (routers and adapter trained together from
            the start, ``recipes/qwen2.5-1.5b/joint_distill.yaml``): how the routers start, as in
            ``RouterCalibration`` (``importance``: fitted to their groups' contribution in the dense model before the
            first step). With a checkpoint the routers start from it: only ``random`` (the default) is accepted.
        other args: see ``WideTask``; the default learning rate is 2e-4.
    """

    stage = "lora"

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        router_checkpoint: Optional[str] = None,
        routing: Optional[WideConfig] = None,
        adapter: str = "lora",
        lora_r: int = 16,
        lora_alpha: float = DEFAULT_LORA_ALPHA,
        lora_dropout: float = 0.1,
        lora_targets: Optional[list[str]] = None,
        supra_lora_share: float = 0.5,
        sparse_score: str = "wanda",
        calibration_batches: int = 4,
        train_routers: bool = True,
        router_init: str = "random",
        router_init_tokens: int = 65536,
        lr: float = 2e-4,
        **kwargs,
    ):
        if router_checkpoint is not None:
            meta = read_metadata(router_checkpoint)  # fail early on a bad path, before any model load
            if routing is not None and routing != meta["wide_config"]:
                raise ValueError(
                    "routing: differs from the router checkpoint's WideConfig; leave it unset in stage 2 "
                    f"(checkpoint: {meta['wide_config']})"
                )
            routing = meta["wide_config"]
        if not (isinstance(lora_r, int) and lora_r > 0):
            raise ValueError(f"lora_r: must be a positive integer, got {lora_r!r}")
        if not (isinstance(calibration_batches, int) and calibration_batches > 0):
            raise ValueError(f"calibration_batches: must be a positive integer, got {calibration_batches!r}")
        adapter_cls = resolve_adapter(adapter)
        kind = adapter_cls()
        targets = list(lora_targets or LORA_TARGETS)
        settings = kind.settings(r=lora_r, alpha=lora_alpha, dropout=lora_dropout, targets=targets,
                                 lora_share=supra_lora_share, score=sparse_score)
        super().__init__(model, routing, lr=lr, **kwargs)  # the other WideTask arguments pass through
        check_router_init(self.routing, router_init, router_init_tokens)
        if router_init != "random" and router_checkpoint is not None:
            raise ValueError(f"router_init: {router_init!r} starts routers without a checkpoint; this fit loads them "
                             "from router_checkpoint (drop one of the two)")
        self.router_init = router_init
        self.router_init_tokens = router_init_tokens
        self.router_checkpoint = router_checkpoint
        self.adapter = adapter_cls.registered_name
        self.adapter_class_path = class_path(adapter_cls)
        self.adapter_settings = settings
        self.lora_r = lora_r
        self.lora_alpha = lora_alpha
        self.lora_dropout = lora_dropout
        self.lora_targets = targets
        self.calibration_batches = calibration_batches
        self.train_routers = train_routers

    def build_model(self) -> nn.Module:
        from lightning.pytorch.utilities import rank_zero_info

        model = super().build_model()
        if self.router_checkpoint is not None:
            load_trained(model, self.router_checkpoint, prefixes=(".wide.routers.",))
        inject_adapter(model, self.adapter, self.adapter_settings)
        for name, p in model.named_parameters():
            adapter = is_adapter_name(name)
            if adapter:
                p.data = p.data.float()  # optimizer state in fp32 even over a bf16 backbone
            p.requires_grad_(adapter or (self.train_routers and is_router_name(name)))
        rank_zero_info(self.budget_line(model))
        return model

    def budget_line(self, model: nn.Module) -> str:
        """The log line of the trained adapter parameters, by tensor kind, against LoRA of rank ``lora_r``."""
        from peft.tuners.tuners_utils import BaseTunerLayer

        kind = ADAPTERS.get(self.adapter)()
        counts = {m: sum(p.numel() for n, p in model.named_parameters() if m in n) for m in kind.tensor_markers()}
        bases = {id(m.get_base_layer()): m.get_base_layer() for m in model.modules() if isinstance(m, BaseTunerLayer)}
        budget = sum(self.lora_r * (b.in_features + b.out_features) for b in bases.values())
        parts = ", ".join(f"{m.rstrip('_')} {n:,}" for m, n in counts.items())
        return (f"wide: adapter {self.adapter} ({kind.describe(self.adapter_settings)}): {sum(counts.values()):,} "
                f"trainable parameters ({parts}) on {len(bases)} matrices; LoRA r={self.lora_r} on them: {budget:,}")

    def on_fit_start(self) -> None:
        warm_start_routers(self)  # router_init: importance, no router checkpoint (a no-op otherwise)
        # the support of a data-chosen sparse adapter is measured once, on the training device, before the first
        # step; a resumed run restored the one it chose (its indices are part of the checkpoint)
        kind = ADAPTERS.get(self.adapter)()
        if not kind.needs_calibration(self.adapter_settings) or self.trainer.ckpt_path is not None:
            return
        from lightning.pytorch.utilities import rank_zero_info

        datamodule = self.trainer.datamodule
        if datamodule is None:
            raise ValueError(f"adapter: {self.adapter} with sparse_score {self.adapter_settings.get('score')!r} "
                             "calibrates on training batches; fit with a datamodule (or sparse_score: magnitude)")

        def batches():
            for i, batch in enumerate(datamodule.train_dataloader()):
                if i == self.calibration_batches:
                    return
                yield self.trainer.strategy.batch_to_device(batch)

        rank_zero_info(f"wide: {kind.calibrate(self.model, batches(), self.adapter_settings, self.mean_over_ranks)}")

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["wide"]["adapter"] = json.dumps(self.checkpoint_extra()["adapter"], sort_keys=True)

    def _check_resume(self, info: dict[str, Any]) -> None:
        super()._check_resume(info)
        saved, have = json.loads(info.get("adapter", "null")), self.checkpoint_extra()["adapter"]
        if saved is not None and saved != have:  # a partial state dict would load silently (strict=False)
            raise ValueError(f"ckpt_path: made with adapter {saved}, this run has {have}; a resume checkpoint "
                             "continues the same run")

    def checkpoint_extra(self) -> dict[str, Any]:
        return {"adapter": {"name": self.adapter, "class_path": self.adapter_class_path, **self.adapter_settings}}
