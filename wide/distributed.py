"""Multi-GPU training over a frozen backbone: FSDP2 sharding, trained-tensor gathering, a Lightning strategy.

Two Lightning strategies are supported (both keep the single-GPU recipes' semantics):

- ``ddp``: every rank holds the whole model; DDP all-reduces only parameters that require grad (routers,
  LoRA). Every built-in trainable router feeds the loss each step, so ``find_unused_parameters`` can
  stay off; a plug-in router with parameters that may miss the graph needs
  ``strategy: ddp_find_unused_parameters_true``.
- ``FSDP2Strategy`` below (Lightning's ``ModelParallelStrategy`` with data parallelism only):
  ``WideTask.configure_model`` calls :func:`shard_model`, which applies ``fully_shard`` per decoder layer
  and then to the root. Frozen bf16 weights and fp32 routers / LoRA share a layer's parameter group
  (FSDP2 only asks trainable parameters to agree on a dtype). FSDP1 (``strategy: fsdp``) is rejected.

Checkpoints stay one file whatever the world size: :func:`gather_trained_state` all-gathers just the
router and LoRA tensors (every rank must call it), rank 0 writes ``routers.safetensors``, and
``FSDP2Strategy`` writes ``last.ckpt`` as one file holding only the parameters that require grad.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Optional

import torch
from torch import nn

from wide.io.checkpoint import trained_tensors

__all__ = ["FSDP2Strategy", "gather_trained_state", "shard_model"]


def _full(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def gather_trained_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Full CPU copies of the router and LoRA tensors, by parameter name, on every rank.

    Under FSDP2 the parameters are sharded ``DTensor``s and this all-gathers each one (only these, never
    the frozen backbone), so every rank must call it, in the same order; without sharding it is a copy.
    What ``wide.io.checkpoint.save_trained`` writes (``state=``), which gathers nothing itself.
    """
    _reject_fsdp1(model)
    out = {}
    for name, p in trained_tensors(model).items():
        out[name] = _full(p.detach()).to("cpu").contiguous()
    return out


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    from wide.modeling.architectures import arch_for, get_path

    return list(get_path(model, arch_for(model.config).layers))


def shard_model(model: nn.Module, mesh, *, reshard_after_forward: bool = True) -> nn.Module:
    """FSDP2: ``fully_shard`` each decoder layer (with its routers and LoRA), then the root (embeddings, head).

    Args:
        model: The routed HF causal LM (``apply_wide`` and peft already applied).
        mesh: A 1-D device mesh over the data-parallel ranks.
        reshard_after_forward: Free the gathered decoder layer after its forward (ZeRO-3); ``False`` keeps it
            until backward (ZeRO-2 memory, fewer all-gathers). The root (embeddings, final norm, head) always
            stays gathered from its forward to the end of the backward.
    """
    from torch.distributed.fsdp import fully_shard

    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
    # the root keeps FSDP2's own rule (gathered from its forward until the backward ends): the fused head loss
    # (`wide.losses`) multiplies by the head's weight after the root's forward, outside its hooks
    fully_shard(model, mesh=mesh)
    return model


def _reject_fsdp1(model: nn.Module) -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel

    if any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
        raise ValueError("trainer.strategy: FSDP1 ('fsdp') is not supported; use wide.distributed.FSDP2Strategy")


def check_strategy(strategy: Any) -> None:
    """Rejects strategies `wide` cannot train with, naming the fix."""
    from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy

    if isinstance(strategy, FSDPStrategy):
        raise ValueError(
            "trainer.strategy: FSDPStrategy (FSDP1) is not supported; use "
            "{class_path: wide.distributed.FSDP2Strategy} (FSDP2, one decoder layer per shard group) or ddp"
        )
    if isinstance(strategy, ModelParallelStrategy) and strategy._tensor_parallel_size not in (1, "auto"):
        raise ValueError(
            f"trainer.strategy: tensor_parallel_size={strategy._tensor_parallel_size} is not supported; "
            "wide shards over data-parallel ranks only (use wide.distributed.FSDP2Strategy)"
        )
    if isinstance(strategy, ModelParallelStrategy) and not isinstance(strategy, FSDP2Strategy):
        if strategy._tensor_parallel_size == "auto":
            raise ValueError(
                "trainer.strategy: ModelParallelStrategy defaults to tensor parallelism across a node's GPUs; "
                "use wide.distributed.FSDP2Strategy (or set tensor_parallel_size: 1 and data_parallel_size: "
                "<number of GPUs>)"
            )


try:
    from lightning.pytorch.strategies import ModelParallelStrategy as _ModelParallelStrategy
except ImportError:  # pragma: no cover - lightning < 2.4
    _ModelParallelStrategy = object  # type: ignore[assignment,misc]


class FSDP2Strategy(_ModelParallelStrategy):
    """FSDP2 data parallelism for a frozen backbone with trainable routers / LoRA.

    Lightning's ``ModelParallelStrategy`` with tensor parallel size 1 and all processes data-parallel;
    the model is sharded per decoder layer by ``WideTask.configure_model``. Resume checkpoints are one
    file holding only the parameters that require grad (and their optimizer state), gathered on rank 0,
    so they are small and load on any world size.

    Args:
        process_group_backend: ``nccl`` on GPUs (default), ``gloo`` on CPU.
        timeout: Collective timeout.
    """

    def __init__(self, process_group_backend: Optional[str] = None, timeout: Optional[timedelta] = None):
        from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout

        super().__init__(data_parallel_size="auto", tensor_parallel_size=1, save_distributed_checkpoint=False,
                         process_group_backend=process_group_backend,
                         timeout=timeout if timeout is not None else default_pg_timeout)

    def setup_environment(self) -> None:
        self._data_parallel_size = self.num_nodes * self.num_processes
        super().setup_environment()

    def teardown(self) -> None:
        super().teardown()
        # Lightning keeps process groups until exit; a 1-process group only leaks into what runs next
        # in the same interpreter (an in-process recipe test, a notebook)
        if self.world_size == 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()

    def lightning_module_state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
        return get_model_state_dict(self.model, options=options)
