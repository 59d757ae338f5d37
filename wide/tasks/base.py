"""`WideTask`: the LightningModule both training stages share (loss, optimizer, schedule, metrics)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
from typing import Any, Optional, Union

import lightning as L
import torch
from torch import nn
from torchmetrics import MeanMetric

import wide
from wide.config import WideConfig
from wide.io.checkpoint import is_router_name
from wide.io.loading import DEFAULT_MODEL, DTYPES
from wide.losses import LossConfig, counted_tokens, lm_loss, objective


def batch_seed(seed: int, epoch: int, batch_idx: int, rank: int) -> int:
    """The RNG seed of one training batch on one rank: a hash of all four, so no two batches share noise."""
    key = f"{seed}:{epoch}:{batch_idx}:{rank}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "little") >> 1


class WideTask(L.LightningModule):
    """Loads a causal LM, routes it, and trains with ``objective + lam * |target - realized skip rate|``.

    The objective (``loss``) is next-token cross-entropy by default; self-distillation from the dense backbone
    (routing off, LoRA disabled, same weights) and hidden-state matching mix in by weight (`wide.losses`).

    Args:
        model: Hugging Face model name, local folder, or a named offline asset (``wide assets list``).
        routing: The ``WideConfig`` (sparsity targets, granularity, group sizes, router).
        lam: Weight of the sparsity term (one term, or one per router kind when per-kind targets are set).
        layer_cap: Highest skip rate any one routed sub-layer (layer and kind) may realize in training, or ``None``
            for no cap. Each (layer, kind) whose batch rate goes past it adds ``lam * (rate - cap)`` to the
            sparsity term, so routers cannot meet the global target by all but removing a few layers (Qwen2.5-1.5B
            at 50% by weight skipped 93-99% of the FFN of layers 13-15 uncapped, and lost its arithmetic).
        lr: Peak learning rate of AdamW.
        weight_decay: AdamW weight decay.
        warmup_ratio: Fraction of the total steps spent in linear warmup before the cosine decay.
        min_lr_ratio: Final learning rate as a fraction of ``lr``.
        dtype: Dtype of the frozen backbone: ``float32``, ``bfloat16``, ``float16``, or ``None`` for
            bfloat16 when the Trainer's precision is bf16 and float32 otherwise.
        attn_implementation: HF attention implementation of the backbone (``sdpa``, ``eager``, ...).
        gradient_checkpointing: Recompute decoder layers in backward to save memory.
        fuse_glue: Compile the elementwise glue between the projections for training (`wide.fuse_glue`: the RMS
            norms, RoPE and the routed MLP's ``silu(gate) ⊙ mask ⊙ up``, forward and backward); ``True`` for
            inductor (on a GPU: Triton; on a CPU it needs a C++ compiler), or a ``torch.compile`` backend name.
            The values do not change beyond rounding; the first steps pay the compile (seconds).
        loss: The objective besides the sparsity term (``LossConfig``: ``lm``, ``kd``, ``temperature``, ``hidden``,
            ``backend``); default plain next-token cross-entropy.
        router_lr: Peak learning rate of the routers' parameters, where it should differ from ``lr`` (the other
            trained tensors'): stage 2 trains LoRA at 2e-4, and from scratch (no stage-1 checkpoint) its routers want
            stage 1's 2e-3. Same warmup and cosine schedule. ``None``: the routers train at ``lr``.
    """

    stage = "base"

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        routing: Optional[WideConfig] = None,
        lam: float = 20.0,
        layer_cap: Optional[float] = None,
        lr: float = 2e-3,
        weight_decay: float = 0.01,
        warmup_ratio: float = 0.1,
        min_lr_ratio: float = 0.0,
        dtype: Optional[str] = None,
        attn_implementation: str = "sdpa",
        gradient_checkpointing: bool = False,
        fuse_glue: Union[bool, str] = False,
        loss: Optional[LossConfig] = None,
        router_lr: Optional[float] = None,
    ):
        super().__init__()
        loss = loss if loss is not None else LossConfig()
        if isinstance(loss, dict):
            loss = LossConfig(**loss)
        routing = routing if routing is not None else WideConfig()
        if isinstance(routing, dict):
            routing = WideConfig(**routing)
        if not isinstance(model, str) or not model:
            raise ValueError(f"model: must be a model name, folder or asset name, got {model!r}")
        if not lam >= 0:
            raise ValueError(f"lam: must be >= 0, got {lam!r}")
        if layer_cap is not None and (isinstance(layer_cap, bool) or not isinstance(layer_cap, (int, float))
                                      or not 0.0 < float(layer_cap) <= 1.0):
            raise ValueError(f"layer_cap: must be None or a skip rate in (0, 1], got {layer_cap!r}")
        if layer_cap is not None and float(layer_cap) < max(routing.target_for(k) for k in ("attn", "ffn")):
            raise ValueError(f"layer_cap: {layer_cap} is below the sparsity target; every layer at the cap could "
                             "not reach it")
        if not lr > 0:
            raise ValueError(f"lr: must be > 0, got {lr!r}")
        if router_lr is not None and (isinstance(router_lr, bool) or not isinstance(router_lr, (int, float))
                                      or not router_lr > 0):
            raise ValueError(f"router_lr: must be None (the routers train at lr) or a number > 0, got {router_lr!r}")
        if not 0 <= warmup_ratio < 1:
            raise ValueError(f"warmup_ratio: must be in [0, 1), got {warmup_ratio!r}")
        if not 0 <= min_lr_ratio <= 1:
            raise ValueError(f"min_lr_ratio: must be in [0, 1], got {min_lr_ratio!r}")
        if not isinstance(fuse_glue, (bool, str)) or fuse_glue == "":
            raise ValueError(f"fuse_glue: must be true, false or a torch.compile backend name, got {fuse_glue!r}")
        if dtype is not None and dtype not in DTYPES:
            raise ValueError(f"dtype: must be one of {sorted(DTYPES)} or None, got {dtype!r}")
        self.model_name = model
        self.routing = routing
        self.lam = lam
        self.layer_cap = None if layer_cap is None else float(layer_cap)
        self.lr = lr
        self.router_lr = None if router_lr is None else float(router_lr)
        self.weight_decay = weight_decay
        self.warmup_ratio = warmup_ratio
        self.min_lr_ratio = min_lr_ratio
        self.dtype_name = dtype
        self.attn_implementation = attn_implementation
        self.gradient_checkpointing = gradient_checkpointing
        self.fuse_glue = fuse_glue
        self.loss = loss
        self.save_hyperparameters(ignore=["routing", "loss"])
        self.hparams["routing"] = routing.to_dict()
        self.hparams["loss"] = loss.to_dict()
        self.model: Optional[nn.Module] = None
        self.identity: Optional[dict[str, Any]] = None  # the backbone's identity, taken before any sharding
        self.val_nll = MeanMetric()
        self.val_skip = MeanMetric()
        self.strict_loading = False  # resume checkpoints hold only the trained tensors
        self._preflight_done = False
        self._loss_path_logged = False
        self._start_step: Optional[int] = None  # global step this fit started at (after a resume's restore)

    # ----------------------------------------------------------------------------------------- model
    def _backbone_dtype(self) -> torch.dtype:
        if self.dtype_name is not None:
            return DTYPES[self.dtype_name]
        precision = str(getattr(self._trainer, "precision", "32")) if self._trainer is not None else "32"
        return torch.bfloat16 if precision.startswith("bf16") else torch.float32

    def load_backbone(self) -> nn.Module:
        from wide.assets import resolve_model
        from wide.io.loading import pretrained_lm

        path = resolve_model(self.model_name)
        if not sys.stderr.isatty():  # no "Loading weights" bar redrawn with carriage returns into a log file
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
        model = pretrained_lm(path, dtype=self._backbone_dtype(), attn_implementation=self.attn_implementation)
        model.config.use_cache = False
        return model

    def build_model(self) -> nn.Module:
        """Backbone → ``apply_wide``; stages extend this."""
        return wide.apply_wide(self.load_backbone(), self.routing)

    def preflight(self, datamodule: Any = None, trainer: Any = None, ckpt_path: Any = None) -> None:
        """Checks the model, routing, ``seq_len``, router and resume checkpoints and strategy without weights.

        Raises ``ValueError`` naming the bad field before any weights are loaded (``wide.tasks.checks``).
        """
        from wide.tasks.checks import preflight

        preflight(self, datamodule, trainer, ckpt_path)
        self._preflight_done = True

    def setup(self, stage: str) -> None:
        if not self._preflight_done:
            trainer = self._trainer
            self.preflight(getattr(trainer, "datamodule", None), trainer, getattr(trainer, "ckpt_path", None))

    def configure_model(self) -> None:
        if self.model is not None:
            return
        # Build on the CPU from one fixed RNG state: router and LoRA initial values then depend only on the
        # seed, not on where the strategy creates tensors (a single-device strategy creates them on its GPU,
        # with that GPU's generator; FSDP2 on the CPU) nor on the rank, so every strategy and world size
        # starts from the same weights. Lightning moves (or shards) the model onto the devices afterwards.
        seed = int(os.environ.get("PL_GLOBAL_SEED", torch.initial_seed()))
        with torch.random.fork_rng(devices=[]), torch.device("cpu"):
            torch.manual_seed(seed)
            model = self.build_model()
        if self.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if self.fuse_glue:
            from wide.modeling.fuse import fuse_glue

            fuse_glue(model, "inductor" if self.fuse_glue is True else self.fuse_glue)
        model.train(self.training)
        from wide.io.checkpoint import model_identity

        self.identity = model_identity(model)
        mesh = getattr(self, "_device_mesh", None)  # set by ModelParallelStrategy (wide.distributed.FSDP2Strategy)
        if mesh is not None:
            from wide.distributed import shard_model

            shard_model(model, mesh["data_parallel"] if mesh.mesh_dim_names else mesh)
        self.model = model

    def forward(self, **batch: Any):
        return self.model(**batch)

    # ------------------------------------------------------------------------------------------ loss
    def sparsity_loss(self, stats: "wide.SparsityStats") -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``lam * |target - realized|``: one global term (kinds averaged, or by routed weight with
        ``sparsity_measure="weight"``), or one term per router kind (`wide.modeling.rate.target_rates`)."""
        from wide.modeling.rate import target_rates

        rates = target_rates(stats, self.routing, differentiable=True)
        realized = self.global_rates(torch.stack([rate for _, rate in rates.values()]))
        logs = {}
        terms = []
        for (name, (target, _)), rate in zip(rates.items(), realized):
            terms.append((target - rate).abs())
            if self.routing.per_kind_targets:
                logs[f"gap_{name}"] = terms[-1].detach()
        gap = torch.stack(terms).sum()
        logs["gap"] = gap.detach()
        if self.layer_cap is not None:
            over = self.layer_overshoot(stats)
            logs["over_cap"] = over.detach()
            gap = gap + over
        return self.lam * gap, logs

    def layer_overshoot(self, stats: "wide.SparsityStats") -> torch.Tensor:
        """``Σ over (layer, kind) of max(0, rate - layer_cap)``, on the global batch's per-layer rates.

        Summed, not averaged: one layer past the cap costs as much as the same gap in the global target, whatever
        the depth, so the cap holds as a constraint rather than as a small nudge (hand-written: no library has it).
        """
        rates = self.global_rates(torch.cat([stats.skip_grad[k] for k in stats.kinds]))
        return torch.relu(rates - self.layer_cap).sum()

    def global_rates(self, local: torch.Tensor) -> torch.Tensor:
        """Skip rates of the whole global batch, with this rank's gradient (straight-through).

        The target applies to the global batch, as on one device: ``|target - mean over ranks|``, not the
        mean of each rank's own gap (larger, by Jensen, and pulling each rank separately). The value is
        the all-reduced mean; the gradient flows through this rank's rate, and the strategy's gradient
        averaging over ranks then gives exactly the one-device gradient ``sign · ∇ mean rate``.
        """
        trainer = self._trainer
        if trainer is None or trainer.world_size <= 1:
            return local
        mean = self.mean_over_ranks(local.detach().float()).to(local.dtype)
        return mean + (local - local.detach())

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        # Gumbel noise and LoRA dropout draw from the global RNG; seeding it per batch from (seed, epoch,
        # batch, rank) makes every step's randomness independent of what ran before, so a run resumed
        # from a checkpoint draws exactly what the uninterrupted run drew (Lightning does not restore RNG)
        seed = int(os.environ.get("PL_GLOBAL_SEED", 0))  # set by seed_everything
        torch.manual_seed(batch_seed(seed, self.current_epoch, batch_idx, self.global_rank))
        # the routers' Gumbel noise comes from a per-batch seed shared by all ranks, drawn for the global
        # batch: any world size routes each row as one process would (LoRA dropout stays per rank)
        trainer = self._trainer
        world = trainer.world_size if trainer is not None else 1
        wide.modeling.runtime_of(self.model).set_noise(batch_seed(seed, self.current_epoch, batch_idx, -1),
                                                       rank=self.global_rank, world=world)

    def on_train_start(self) -> None:
        self._start_step = self.global_step

    @property
    def steps_this_run(self) -> int:
        """Optimizer steps this fit took (0 before training starts; a resume's restored steps not counted)."""
        return 0 if self._start_step is None or self._trainer is None else self.global_step - self._start_step

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # Lightning validates every `val_check_interval` steps only, so a run shorter than that (or not a
        # multiple of it) would end unvalidated; a stop request at the last step makes Lightning validate there
        # (the stop itself changes nothing: the loop ends at this step anyway)
        from wide.callbacks.progress import is_last_step

        if is_last_step(self.trainer):
            self.trainer.should_stop = True

    def mean_over_ranks(self, values: torch.Tensor) -> torch.Tensor:
        """Mean of ``values`` over data-parallel ranks (one all-reduce; identity on one process)."""
        trainer = self._trainer
        if trainer is None or trainer.world_size <= 1:
            return values
        return trainer.strategy.reduce(values, reduce_op="mean")

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        obj = objective(self.model, batch, self.loss)  # the teacher (if any) runs first and records no routing
        if not self._loss_path_logged:
            from lightning.pytorch.utilities import rank_zero_info

            rank_zero_info(f"wide: training loss {self.loss.to_dict()}, fused linear loss via {obj.path}")
            self._loss_path_logged = True
        stats = wide.sparsity_stats(self.model)
        sp_loss, sp_logs = self.sparsity_loss(stats)
        loss = obj.total + sp_loss
        parts = {f"{k}_loss": v for k, v in (("lm", obj.lm), ("kd", obj.kd), ("hidden", obj.hidden)) if v is not None}
        logs = {"loss": loss, **parts, "sparsity": stats.realized(), **sp_logs}
        # one all-reduce for every scalar; all ranks see the same values, so all stop together on NaN
        values = self.mean_over_ranks(torch.stack([v.detach().float().reshape(()) for v in logs.values()]))
        if not bool(torch.isfinite(values).all()):
            raise FloatingPointError(self._non_finite_message(obj.total, sp_loss))
        bs = batch["input_ids"].shape[0]
        for (name, _), value in zip(logs.items(), values):
            self.log(f"train/{name}", value, prog_bar=name in ("loss", "lm_loss", "kd_loss", "sparsity"), batch_size=bs)
        self.log("train/tau", wide.modeling.runtime_of(self.model).tau, batch_size=bs)
        return loss

    def _non_finite_message(self, obj_loss: torch.Tensor, sp_loss: torch.Tensor) -> str:
        msg = (f"non-finite loss at step {self.global_step} (this rank: objective {obj_loss.item():.4g}, "
               f"sparsity {sp_loss.item():.4g}); stopping")
        from wide.callbacks.checkpoint import WideCheckpoint

        ckpt = next((c for c in self.trainer.callbacks if isinstance(c, WideCheckpoint)), None)
        if ckpt is not None and ckpt.dirpath is not None and ckpt.earlier_results():
            msg += (f". The last good files are kept in {ckpt.dirpath} ({ckpt.FILENAME}, last.ckpt); lower lr or "
                    "lam, or resume with --ckpt_path last")
        return msg

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._eval_step(batch, "val")

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._eval_step(batch, "test")

    def _eval_step(self, batch: dict[str, torch.Tensor], split: str) -> None:
        nll = lm_loss(self.model, batch, backend=self.loss.backend, chunk_size=self.loss.chunk_size)
        n_tokens = counted_tokens(batch)
        self.val_nll.update(nll.detach().float(), weight=n_tokens)
        stats = wide.sparsity_stats(self.model)
        self.val_skip.update(stats.realized().float(), weight=n_tokens)

    def _log_eval(self, split: str) -> None:
        nll = self.val_nll.compute()  # torchmetrics reduces over ranks (token-weighted)
        self.log(f"{split}/loss", nll, prog_bar=True, sync_dist=True)
        self.log(f"{split}/ppl", torch.exp(nll), prog_bar=True, sync_dist=True)
        self.log(f"{split}/sparsity", self.val_skip.compute(), prog_bar=True, sync_dist=True)
        self.val_nll.reset()
        self.val_skip.reset()

    def on_validation_epoch_end(self) -> None:
        self._log_eval("val")

    def on_test_epoch_end(self) -> None:
        self._log_eval("test")

    # ------------------------------------------------------------------------------------- optimizer
    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def configure_optimizers(self):
        params = self.trainable_parameters()
        if not params:
            raise ValueError("model: nothing to train (no router or LoRA parameter requires grad)")
        lr_of = {id(p): self.lr for p in params}
        if self.router_lr is not None:
            for name, p in self.model.named_parameters():
                if id(p) in lr_of and is_router_name(name):
                    lr_of[id(p)] = self.router_lr
        groups = []
        # decay on matrices only; two groups per learning rate, kept when empty, so a resume checkpoint's optimizer
        # state has the same groups as the run that wrote it (before router_lr: one pair)
        for lr in sorted(set(lr_of.values())):
            for decay in (True, False):
                group = [p for p in params if lr_of[id(p)] == lr and (p.ndim >= 2) == decay]
                groups.append({"params": group, "lr": lr, "weight_decay": self.weight_decay if decay else 0.0})
        opt = torch.optim.AdamW(groups, lr=self.lr)
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warmup = int(self.warmup_ratio * total)
        floor = self.min_lr_ratio

        def schedule(step: int) -> float:
            if step < warmup:
                return (step + 1) / (warmup + 1)
            progress = min(1.0, (step - warmup) / max(1, total - warmup))
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    # ---------------------------------------------------------------------------------- checkpoints
    def checkpoint_extra(self) -> dict[str, Any]:
        """What the trained-tensor checkpoint records besides the model name (stage 2: its adapter's settings)."""
        return {}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Lightning's .ckpt is for resume only: keep just the trained tensors, not the frozen backbone
        from wide.io.checkpoint import is_trained_name

        state = checkpoint["state_dict"]
        for k in list(state):
            if not is_trained_name(k) and not k.startswith("val_"):
                del state[k]
        # plain str / float only, so the file loads with torch.load(weights_only=True)
        checkpoint["wide"] = {
            "stage": self.stage,
            "model": self.model_name,
            "routing": json.dumps(self.routing.to_dict(), sort_keys=True),
            "identity": json.dumps(self.identity, sort_keys=True),
            "tau": float(wide.modeling.runtime_of(self.model).tau),
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.configure_model()
        info = checkpoint.get("wide")
        if info is None:
            raise ValueError("ckpt_path: not a wide resume checkpoint (no 'wide' entry); pass a last.ckpt "
                             "written by WideCheckpoint")
        self._check_resume(info)
        wide.set_temperature(self.model, info["tau"])

    def _check_resume(self, info: dict[str, Any]) -> None:
        if info["stage"] != self.stage:
            raise ValueError(
                f"ckpt_path: written by stage {info['stage']!r}, this run is stage {self.stage!r}; a resume "
                "checkpoint continues the same run (stage 2 starts from stage-1 routers via router_checkpoint)"
            )
        saved, have = json.loads(info["routing"]), self.routing.to_dict()
        diffs = [f"{k}: checkpoint {saved.get(k)!r} vs run {have.get(k)!r}"
                 for k in sorted(set(saved) | set(have)) if saved.get(k) != have.get(k)]
        if diffs:
            raise ValueError("ckpt_path: made for another routing config; " + "; ".join(diffs))
        from wide.io.checkpoint import check_identity_dicts

        check_identity_dicts(json.loads(info["identity"]), self.identity, where="ckpt_path")

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        # resume checkpoints hold only trained tensors (see on_save_checkpoint)
        return super().load_state_dict(state_dict, strict=False, assign=assign)
