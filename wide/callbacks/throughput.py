"""Training throughput: tokens per second and model FLOPs utilisation, on the progress bar and in the logs.

Lightning's ``ThroughputMonitor`` callback logs to the logger only (not the progress bar), looks for a
``flops_per_batch`` attribute, and its GPU table does not match the H200's device name (``"NVIDIA H200"``) and lists
the H200's with-sparsity bf16 figure; so this callback keeps Lightning's windowed counter
(``lightning.fabric.utilities.throughput.Throughput``) and brings its own FLOP formula and dense peaks.
"""

from __future__ import annotations

import time
from typing import Any, Optional

import lightning as L
import torch
from torch import nn

from wide.io.checkpoint import is_router_name

__all__ = ["PEAK_TFLOPS", "TokenThroughput", "peak_tflops", "train_flops_per_token"]

PEAK_TFLOPS: dict[str, float] = {
    "h200": 989.0,
    "h100 pcie": 756.0,
    "h100": 989.0,  # SXM (device name "NVIDIA H100 80GB HBM3")
    "a100": 312.0,
}
"""Dense (no 2:4 sparsity) bf16/fp16 tensor-core peak per GPU in TFLOP/s, NVIDIA's datasheets; first match of the
lower-cased device name wins (so ``h100 pcie`` is tried before ``h100``)."""


def peak_tflops(device: torch.device, dtype: torch.dtype) -> Optional[float]:
    """The table's peak for ``device`` computing in ``dtype`` (bf16/fp16 only), or ``None`` when unknown."""
    if device.type != "cuda" or dtype not in (torch.bfloat16, torch.float16):
        return None
    name = torch.cuda.get_device_name(device).lower()
    return next((peak for key, peak in PEAK_TFLOPS.items() if all(word in name for word in key.split())), None)


def _matmul_elements(model: nn.Module) -> dict[str, float]:
    """Weight elements of the model's linear layers by role: ``backbone`` (decoder projections), ``head``,
    ``router`` and ``lora`` (global shapes, also for FSDP2-sharded weights); ``dense_grad``: the backbone weights
    under a sparse (SHiRA) adapter, whose update is taken from a dense weight gradient."""
    from peft.tuners.shira.layer import ShiraLayer

    head = model.get_output_embeddings()
    sparse = {id(m.get_base_layer()) for m in model.modules() if isinstance(m, ShiraLayer)}
    out = {"backbone": 0.0, "head": 0.0, "router": 0.0, "lora": 0.0, "dense_grad": 0.0}
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if not isinstance(module, nn.Linear) or weight is None:
            continue
        role = ("head" if module is head else "router" if is_router_name(name)
                else "lora" if "lora_" in name else "backbone")
        out[role] += float(weight.numel())
        if id(module) in sparse:
            out["dense_grad"] += float(weight.numel())
    return out


def train_flops_per_token(model: nn.Module, seq_len: int, *, student_head: bool = True, teacher: bool = False,
                          teacher_head: bool = False) -> float:
    """Model FLOPs of one training token of a WIDE stage (no recompute counted, masked groups counted: training
    multiplies masks over dense compute).

    With ``N_b`` backbone, ``N_h`` head, ``N_r`` router and ``N_l`` LoRA weight elements and
    ``A = 2 · L · T · H · d`` the causal attention FLOPs of a forward token (``L`` layers, ``T = seq_len``, ``H · d``
    query width), a token costs

        ``4 (N_b + N_h) + 6 (N_r + N_l) + 3 A``  (+ ``2 N_b + A`` for the teacher, + ``2 N_h`` with its head)

    the forward (2 per weight element) and the backward's activation gradients (2 more) through the whole frozen
    backbone (routers from layer 0 on need them), weight gradients (2 more) only for routers and LoRA, and attention
    backward at twice its forward; not the ``6 N`` of full training. A sparse (SHiRA) adapter's weights add
    ``2 N_s``: its update is gathered from the dense gradient of the ``N_s`` weight elements it adapts.
    """
    n = _matmul_elements(model)
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    attn = 2.0 * cfg.num_hidden_layers * seq_len * cfg.num_attention_heads * head_dim
    flops = (4 * n["backbone"] + 6 * (n["router"] + n["lora"]) + 2 * n["dense_grad"] + 3 * attn
             + (4 * n["head"] if student_head else 0.0))
    if teacher:
        flops += 2 * n["backbone"] + attn + (2 * n["head"] if teacher_head else 0.0)
    return flops


class TokenThroughput(L.Callback):
    """Logs ``perf/tokens_per_s`` (all ranks together), ``perf/tflops`` (per device) and ``perf/mfu`` (per device,
    against :data:`PEAK_TFLOPS`; omitted on devices the table does not know), on the progress bar and to the logger.

    Rates are over the last ``window`` training steps, from the end of one step to the end of the next (data
    loading included, validation left out, the first step — compilation, warm-up — left out). Steps already sync
    with the host once (the non-finite check on the loss), so the host clock cannot run ahead by more than a step.

    Args:
        window: Steps per rate.
        peak_tflops: Per-device peak to use instead of the table (e.g. a GPU it lacks).
    """

    def __init__(self, window: int = 10, peak_tflops: Optional[float] = None):
        if not (isinstance(window, int) and window >= 2):
            raise ValueError(f"throughput.window: must be an int >= 2, got {window!r}")
        if peak_tflops is not None and not peak_tflops > 0:
            raise ValueError(f"throughput.peak_tflops: must be > 0, got {peak_tflops!r}")
        self.window, self.peak_override = window, peak_tflops
        self.peak: Optional[float] = None
        self._meter = None
        self._flops: dict[int, float] = {}
        self._last: Optional[float] = None
        self._elapsed = 0.0
        self._steps = self._rows = self._tokens = 0

    def on_train_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        from lightning.fabric.utilities.throughput import Throughput

        model = pl_module.model
        dtype = model.get_output_embeddings().weight.dtype
        peak = self.peak_override or peak_tflops(trainer.strategy.root_device, dtype)
        self.peak = None if peak is None else peak * 1e12
        self._meter = Throughput(available_flops=self.peak, world_size=trainer.world_size, window_size=self.window)
        self._flops = {}
        self._last, self._elapsed, self._steps, self._rows, self._tokens = None, 0.0, 0, 0, 0

    def _flops_per_token(self, pl_module: Any, seq_len: int) -> float:
        if seq_len not in self._flops:
            loss = getattr(pl_module, "loss", None)
            kd = getattr(loss, "kd", 0.0) > 0
            self._flops[seq_len] = train_flops_per_token(
                pl_module.model, seq_len, student_head=kd or getattr(loss, "lm", 1.0) > 0,
                teacher=bool(getattr(loss, "uses_teacher", False)), teacher_head=kd)
        return self._flops[seq_len]

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        now = time.perf_counter()
        if self._meter is None or self._last is None:
            self._last = now  # the first step (compilation, warm-up) is not timed
            return
        self._elapsed += now - self._last
        self._last = now
        ids = batch["input_ids"]
        rows, seq_len = ids.shape
        self._steps += 1
        self._rows += rows
        self._tokens += rows * seq_len
        world = trainer.world_size
        # Throughput reads `flops` as the whole job's and divides by the world size for the per-device rate
        flops = self._flops_per_token(pl_module, seq_len) * rows * seq_len * world
        self._meter.update(time=self._elapsed, batches=self._steps, samples=self._rows, lengths=self._tokens,
                           flops=flops)
        rates = self._meter.compute()
        if "device/items_per_sec" not in rates:
            return  # the window is not full yet
        logs = {"perf/tokens_per_s": rates["device/items_per_sec"] * world,
                "perf/tflops": rates["device/flops_per_sec"] / 1e12}
        if "device/mfu" in rates:
            logs["perf/mfu"] = rates["device/mfu"]
        for name, value in logs.items():
            pl_module.log(name, float(value), prog_bar=name != "perf/tflops", on_step=True, on_epoch=False,
                          batch_size=rows, rank_zero_only=True)

    def on_validation_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        if self._last is not None:
            self._last = time.perf_counter()  # validation time does not count as training time
