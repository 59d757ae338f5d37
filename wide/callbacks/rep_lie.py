"""`RepLiePruning`: REP-LIE-style iterative static pruning during stage 2, driven by LoRA gradients."""

from __future__ import annotations

import math
from collections import defaultdict

import lightning as L
import torch

from wide.modeling.architectures import get_path
from wide.routers.rep_lie import RepLieRouter, importance_of, routers_of

ALLOCATIONS = ("kind", "layer")


class RepLiePruning(L.Callback):
    """Prunes the groups of `wide.routers.RepLieRouter` routers (``router: rep_lie``) while LoRA trains.

    After every optimizer step, each router's group importance ``|sum over the group of Ĝ ⊙ W_eff|`` is read
    from the LoRA factors of the projection the group's mask zeroes the input of (``o_proj`` for head groups,
    ``down_proj`` for FFN channel groups; `wide.routers.rep_lie.lora_column_taylor`: no full-weight gradient)
    and folded into a moving mean and variance. On the schedule, the lowest-scoring groups
    (``mean - penalty * std``) are pruned for good, until every kind is pruned to its router's target: the
    share pruned at step ``t`` follows the cubic schedule ``target * (1 - (1 - f)^3)``, ``f`` going from 0 at
    ``start`` to 1 at ``end`` (fractions of the run's optimizer steps); training goes on after ``end`` with the
    final structure, which LoRA then recovers. The final count is ``round(target * groups)`` per kind, so with
    ``sparsity_measure: weight`` (one target for both kinds) the pruned share of the routed weights is the
    target wherever it is a whole number of groups. Training that stops early still ends at the target.

    Needs LoRA on the output projections (``lora_targets`` with ``o_proj`` / ``down_proj``), unsharded LoRA
    tensors (DDP or one device, not FSDP2) and ``train_routers: false`` (the routers have nothing to train).

    Args:
        start: Fraction of the optimizer steps before the first pruning (importance is gathered meanwhile).
        end: Fraction of the optimizer steps at which the target is reached.
        every: Optimizer steps between pruning steps.
        beta: Decay of the importance's moving mean and variance.
        penalty: Weight of the standard deviation in the score (0: the moving mean alone).
        allocation: ``kind``: per router kind, groups ranked across all layers; ``layer``: every layer and kind
            pruned to the target separately.
        min_keep: Groups every router keeps at least (with ``allocation: kind``).
    """

    def __init__(self, start: float = 0.1, end: float = 0.5, every: int = 10, beta: float = 0.9,
                 penalty: float = 0.5, allocation: str = "kind", min_keep: int = 1):
        if not 0.0 <= start <= end <= 1.0:
            raise ValueError(f"start/end: must satisfy 0 <= start <= end <= 1, got {start!r}, {end!r}")
        if not (isinstance(every, int) and every >= 1):
            raise ValueError(f"every: must be an integer >= 1, got {every!r}")
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"beta: must be in [0, 1), got {beta!r}")
        if allocation not in ALLOCATIONS:
            raise ValueError(f"allocation: must be one of {ALLOCATIONS}, got {allocation!r}")
        if not (isinstance(min_keep, int) and min_keep >= 0):
            raise ValueError(f"min_keep: must be an integer >= 0, got {min_keep!r}")
        self.start, self.end, self.every, self.beta, self.penalty = start, end, every, beta, float(penalty)
        self.allocation, self.min_keep = allocation, min_keep
        self._sources: list = []

    # ---- setup ----------------------------------------------------------------------------------

    def setup(self, trainer: L.Trainer, pl_module, stage: str) -> None:
        if stage == "fit" and getattr(pl_module, "train_routers", False):
            raise ValueError("model.init_args.train_routers: RepLiePruning prunes rep_lie routers, which have "
                             "nothing to train; set it to false")

    def on_fit_start(self, trainer: L.Trainer, pl_module) -> None:
        self._sources = self.sources(pl_module.model)

    def sources(self, model) -> list:
        """``(router, [(lora module, ...) per gated sub-layer])`` for every rep_lie router of ``model``."""
        from wide.io.checkpoint import _is_sharded

        found = routers_of(model)
        if not found:
            raise ValueError("router: RepLiePruning needs `router: rep_lie` routers, the model has none")
        arch = model.wide_arch
        layers = get_path(model, arch.layers)
        out = []
        for wl, kind, router in found:
            layer = layers[wl.layer_idx]
            mods = []
            for sub in wl.slots[kind].gates:
                path = f"{arch.attn}.{arch.o_proj}" if sub == "attn" else f"{arch.mlp}.{arch.down_proj}"
                mod = get_path(layer, path)
                if not hasattr(mod, "lora_A") or not len(mod.lora_A):
                    name = path.rsplit(".", 1)[-1]
                    raise ValueError(f"lora_targets: RepLiePruning reads the LoRA gradients of {name} (layer "
                                     f"{wl.layer_idx}), which has no LoRA adapter; add {name!r} to lora_targets")
                if any(_is_sharded(p) for p in mod.parameters()):
                    raise ValueError("trainer.strategy: RepLiePruning needs unsharded LoRA tensors (DDP or one "
                                     "device), not FSDP2")
                mods.append(mod)
            out.append((router, mods))
        return out

    # ---- importance -----------------------------------------------------------------------------

    @staticmethod
    def factors(mod) -> list[tuple]:
        """``(W, A, B, grad_A, grad_B, scaling)`` of every active LoRA adapter of a peft linear."""
        out = []
        for name in mod.lora_A:
            a, b = mod.lora_A[name].weight, mod.lora_B[name].weight
            out.append((mod.get_base_layer().weight, a, b, a.grad, b.grad, float(mod.scaling[name])))
        return out

    def observe(self, sources=None) -> None:
        """Folds the current LoRA gradients into every router's importance statistics."""
        for router, mods in sources if sources is not None else self._sources:
            with torch.no_grad():
                imp = importance_of([f for m in mods for f in self.factors(m)], router.num_groups)
            if imp is not None:
                router.observe(imp, self.beta)

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module, optimizer) -> None:
        self.observe()

    # ---- schedule -------------------------------------------------------------------------------

    def fraction(self, step: int, total: int) -> float:
        """Share of the final pruning reached after ``step`` of ``total`` optimizer steps (cubic in between)."""
        t0, t1 = round(self.start * total), round(self.end * total)
        if step < t0:
            return 0.0
        if step >= t1:
            return 1.0
        return 1.0 - (1.0 - (step - t0) / (t1 - t0)) ** 3

    def prune_to(self, fraction: float, routers: list[RepLieRouter] | None = None) -> None:
        """Prunes, lowest score first, until every kind (or layer) has ``round(fraction * target * groups)``
        pruned groups; groups already pruned stay pruned."""
        routers = [r for r, _ in self._sources] if routers is None else routers
        if any(int(r.updates) == 0 for r in routers):
            return  # no importance seen yet: nothing to rank by
        pools = defaultdict(list)
        for r in routers:
            pools[r.spec.kind if self.allocation == "kind" else (r.spec.kind, r.spec.layer_idx)].append(r)
        for pool in pools.values():
            total = sum(r.num_groups for r in pool)
            want = math.floor(fraction * pool[0].spec.target_sparsity * total + 0.5)
            have = sum(int(r.pruned.sum()) for r in pool)
            if want <= have:
                continue
            cand = []  # (score, layer, group) of every group still running that may go
            for i, r in enumerate(pool):
                score, pruned = r.stability(self.penalty).tolist(), r.pruned.tolist()
                cand += [(score[g], i, g) for g in range(r.num_groups) if not pruned[g]]
            cand.sort()
            left = [r.num_groups - int(r.pruned.sum()) for r in pool]
            floor = self.min_keep if self.allocation == "kind" else 0
            chosen = defaultdict(list)
            for _, i, g in cand:
                if have >= want:
                    break
                if left[i] > floor:
                    chosen[i].append(g)
                    left[i] -= 1
                    have += 1
            for i, groups in chosen.items():
                pool[i].prune(torch.tensor(groups))

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        step, total = trainer.global_step, max(1, int(trainer.estimated_stepping_batches))
        t0 = round(self.start * total)
        if step >= t0 and ((step - t0) % self.every == 0 or step >= round(self.end * total)):
            self.prune_to(self.fraction(step, total))
            pl_module.log("rep_lie/pruned", self.pruned_share(), batch_size=1)

    def on_train_end(self, trainer: L.Trainer, pl_module) -> None:
        self.prune_to(1.0)

    def pruned_share(self) -> float:
        """Share of all rep_lie groups pruned so far."""
        routers = [r for r, _ in self._sources]
        return sum(int(r.pruned.sum()) for r in routers) / max(1, sum(r.num_groups for r in routers))
