"""``adapter: super``: a fixed sparse update per weight matrix (peft SHiRA), its support chosen by a score.

Each target weight ``W [out, in]`` trains ``k = r * (in + out)`` entries, as many parameters as LoRA of rank
``r`` on it, at the positions of the ``k`` largest scores (over the whole matrix):

* ``wanda``: ``|W_ij| * ||X_j||_2``, the weight magnitude times the L2 norm of input channel ``j`` over the
  tokens of a calibration pass (a few training batches through the routed model, routers hard): the entries
  Wanda deems most important, measured on what each routed layer actually sees.
* ``magnitude``: ``|W_ij|`` alone, no data.

peft's SHiRA keeps the support as index tensors in a plain dict; here they become persistent buffers (peft's
``BufferDict``) so the trained-tensor checkpoint, the resume checkpoint and device moves carry them. The
support is set once: from the weights at injection, then (``wanda``) from the calibration pass before the
first step, while the sparse values are still zero; a resumed run keeps the support it saved.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable, Iterable, Optional

import torch
from torch import nn

from wide.io.adapters.base import Adapter, recorded_settings, register_adapter

SCORES = ("wanda", "magnitude")
ADAPTER_NAME = "default"  # peft's adapter name, as ``inject_adapter_in_model`` gives it


def top_support(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Positions of the ``k`` largest entries of ``scores [out, in]`` as ``[2, k]`` int32 (row, column), in
    row-major order (the order peft's SHiRA takes from a mask)."""
    flat = torch.topk(scores.flatten(), k, sorted=False).indices.sort().values
    cols = scores.shape[1]
    return torch.stack([flat // cols, flat % cols]).to(torch.int32)


def wanda_scores(weight: torch.Tensor, input_norm: torch.Tensor) -> torch.Tensor:
    """``|W| * ||X_j||``: ``weight [out, in]``, ``input_norm [in]`` (L2 norm of each input channel) -> ``[out, in]``."""
    return weight.float().abs() * input_norm.float()[None, :]


def magnitude_mask(base_layer: nn.Module, r: int, **kwargs: Any) -> torch.Tensor:
    """SHiRA ``mask_fn``: ones at the ``r * (in + out)`` largest ``|W|`` of ``base_layer``, in its dtype and device."""
    weight = base_layer.weight
    out_f, in_f = weight.shape
    idx = top_support(weight.detach().abs(), min(r * (in_f + out_f), out_f * in_f)).long()
    mask = torch.zeros(out_f, in_f, dtype=weight.dtype, device=weight.device)
    mask[idx[0], idx[1]] = 1
    return mask


def shira_layers(model: nn.Module) -> dict[str, nn.Module]:
    from peft.tuners.shira.layer import ShiraLayer

    return {name: m for name, m in model.named_modules() if isinstance(m, ShiraLayer)}


def index_buffers(model: nn.Module) -> None:
    """Turns each SHiRA layer's index dict into persistent buffers (saved and moved with the model)."""
    from peft.tuners._buffer_dict import BufferDict

    for layer in shira_layers(model).values():
        if not isinstance(layer.shira_indices, BufferDict):
            layer.shira_indices = BufferDict(dict(layer.shira_indices), persistent=True)


def _full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of an FSDP2-sharded weight (a plain tensor as it is)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def input_norms(model: nn.Module, layers: dict[str, nn.Module], batches: Iterable[dict[str, torch.Tensor]]
                ) -> tuple[dict[str, torch.Tensor], int]:
    """Sum over tokens of each input channel's square at every layer in ``layers``, and the token count.

    One no-grad forward per batch in eval mode (routers decide hard, no noise); padding is left out.
    """
    sums = {name: None for name in layers}
    mask: dict[str, Optional[torch.Tensor]] = {"m": None}

    def hook(name, module, args):
        x = args[0].detach().float()
        if mask["m"] is not None:
            x = x * mask["m"][..., None].to(x.dtype)
        s = x.pow(2).reshape(-1, x.shape[-1]).sum(0)
        sums[name] = s if sums[name] is None else sums[name] + s

    handles = [m.register_forward_pre_hook(functools.partial(hook, n)) for n, m in layers.items()]
    was_training, tokens = model.training, 0
    model.eval()
    try:
        with torch.no_grad():
            for batch in batches:
                mask["m"] = batch.get("attention_mask")
                model(input_ids=batch["input_ids"], attention_mask=mask["m"])
                tokens += int(mask["m"].sum()) if mask["m"] is not None else batch["input_ids"].numel()
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    missing = [n for n, s in sums.items() if s is None]
    if missing:
        raise ValueError(f"adapter: the calibration pass never reached {missing[0]} (no batches, or a layer that "
                         "routing always skips)")
    return sums, tokens


@register_adapter("super")
class Super(Adapter):
    """peft SHiRA on a Wanda- or magnitude-chosen support. Settings: ``r`` (budget as a LoRA rank), ``targets``,
    ``score`` (``wanda`` | ``magnitude``)."""

    marker = "shira_"

    def settings(self, r: int, alpha: float, dropout: float, targets: list[str], score: str = "wanda",
                 **options: Any) -> dict[str, Any]:
        if score not in SCORES:
            raise ValueError(f"sparse_score: must be one of {', '.join(SCORES)}, got {score!r}")
        return {"r": r, "targets": list(targets), "score": score}

    def sparse_config(self, r: int, targets: list[str]):
        from peft import ShiraConfig

        with warnings.catch_warnings():  # peft warns about any mask type but its own random one
            warnings.filterwarnings("ignore", message="Argument self.mask_type")
            config = ShiraConfig(r=r, mask_type="magnitude", target_modules=list(targets))
        config.mask_fn = magnitude_mask  # the initial support; ``wanda`` replaces it in ``calibrate``
        return config

    def peft_config(self, settings: dict[str, Any]):
        return self.sparse_config(settings["r"], settings["targets"])

    def inject(self, model: nn.Module, settings: dict[str, Any]) -> None:
        super().inject(model, settings)
        index_buffers(model)

    def needs_calibration(self, settings: dict[str, Any]) -> bool:
        return settings["score"] == "wanda"

    def calibrate(self, model: nn.Module, batches: Iterable[dict[str, torch.Tensor]], settings: dict[str, Any],
                  reduce: Callable[[torch.Tensor], torch.Tensor] = lambda t: t) -> str:
        """Moves each SHiRA support to the top Wanda scores measured on ``batches`` (values must still be zero)."""
        if not self.needs_calibration(settings):
            return ""
        layers = shira_layers(model)
        sums, tokens = input_norms(model, layers, batches)
        names = list(layers)
        # one all-reduce for every layer: each rank saw other batches, all must choose the same support
        flat = reduce(torch.cat([sums[n] for n in names]))
        norms = dict(zip(names, flat.split([sums[n].numel() for n in names])))
        with torch.no_grad():
            for name in names:
                layer = layers[name]
                values = layer.shira_weight[ADAPTER_NAME]
                if bool((values != 0).any()):
                    raise ValueError(f"adapter: {name} already holds trained sparse values; its support is fixed")
                weight = _full(layer.get_base_weight())
                idx = top_support(wanda_scores(weight, norms[name].sqrt()), values.shape[0])
                layer.shira_indices[ADAPTER_NAME] = idx.to(layer.shira_indices[ADAPTER_NAME].device)
        return (f"{self.registered_name}: sparse support of {len(names)} matrices chosen by Wanda scores "
                f"(|W| x input-channel L2 norm over {tokens:,} tokens per rank)")

    def check_tensors(self, shapes: dict[str, tuple[int, ...]], where: str) -> bool:
        """Whether SHiRA values are present; raises when their indices are missing."""
        values = [k for k in shapes if ".shira_weight." in k]
        indices = [k for k in shapes if ".shira_indices." in k]
        if values and len(indices) != len(values):
            raise ValueError(f"checkpoint: {where} holds {len(values)} SHiRA value tensors but {len(indices)} index "
                             "tensors; the support cannot be restored")
        return bool(values)

    def read(self, shapes: dict[str, tuple[int, ...]], extra: dict[str, Any], where: str, **overrides: Any
             ) -> Optional[dict[str, Any]]:
        """The recorded settings (a SHiRA rank is not visible in its tensor shapes alone)."""
        if not self.check_tensors(shapes, where):
            return None
        rec = recorded_settings(extra, self.registered_name, where)
        if rec is None:
            raise ValueError(f"checkpoint: {where} holds SHiRA tensors but does not record its "
                             f"{self.registered_name!r} adapter settings (extra.adapter)")
        return rec

    def describe(self, settings: dict[str, Any]) -> str:
        return f"sparse r={settings['r']} ({settings['score']} support)"
