"""The training objective of both stages, without the sparsity term: LM, self-distillation, hidden matching.

``LossConfig`` is the recipe's ``model.init_args.loss``; :func:`objective` runs the teacher (when a term needs
it) and the student on one batch and returns the weighted loss and its parts. The model is called through its
own forward (so DDP and FSDP2's hooks run as usual) with ``logits_to_keep`` set to no position: the head runs on
nothing there, and the final hidden states, caught at the decoder's last norm, go to the fused linear loss.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Optional

import torch
from torch import nn

from wide.losses.fused import BACKENDS, IGNORE_INDEX, LossParts, fused_linear_loss, liger_available
from wide.losses.teacher import teacher_mode

__all__ = ["LossConfig", "Objective", "counted_tokens", "hidden_match_loss", "lm_loss", "objective"]


@dataclass
class LossConfig:
    """What both stages minimise besides the sparsity term: ``lm · CE + kd · T² · KL + hidden · H``.

    ``kd`` and ``hidden`` distil from the dense teacher: the same backbone with routing off and LoRA disabled,
    run without grad in the same step (no second copy of the weights). Recipe key: ``model.init_args.loss``.
    """

    lm: float = 1.0
    """Weight of next-token cross-entropy on the data (the paper's loss)."""
    kd: float = 0.0
    """Weight of self-distillation: forward KL(teacher ‖ student) of next-token distributions at ``temperature``,
    summed over the vocabulary, averaged over the counted tokens, times ``temperature²``."""
    temperature: float = 1.0
    """Softmax temperature of both distributions in the KL term."""
    hidden: float = 0.0
    """Weight of hidden-state matching: mean over decoder layers of the per-token MSE between the student's and
    the teacher's RMS-normalised hidden states (each layer's output, the last one after the final norm)."""
    backend: str = "auto"
    """Fused linear loss implementation: ``auto`` (Liger-Kernel on CUDA when installed, else the chunked torch
    twin), ``liger`` or ``torch`` (`wide.losses.fused`)."""
    chunk_size: Optional[int] = None
    """Tokens per chunk of the torch implementation (default: about 32 Mi logits per chunk)."""

    def __post_init__(self) -> None:
        for name in ("lm", "kd", "hidden"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value >= 0):
                raise ValueError(f"loss.{name}: must be a number >= 0, got {value!r}")
        if self.lm + self.kd + self.hidden <= 0:
            raise ValueError("loss: lm, kd and hidden are all 0; give at least one term a weight")
        if not (isinstance(self.temperature, (int, float)) and self.temperature > 0):
            raise ValueError(f"loss.temperature: must be > 0, got {self.temperature!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"loss.backend: must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.backend == "liger" and not liger_available():
            raise ValueError("loss.backend: 'liger' needs Liger-Kernel (pip install 'wide[liger]')")
        if self.chunk_size is not None and not (isinstance(self.chunk_size, int) and self.chunk_size >= 1):
            raise ValueError(f"loss.chunk_size: must be None or an int >= 1, got {self.chunk_size!r}")

    @property
    def uses_teacher(self) -> bool:
        return self.kd > 0 or self.hidden > 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Objective:
    """One batch's loss. ``total`` is differentiable; the parts are detached (``None`` when their weight is 0)."""

    total: torch.Tensor
    lm: Optional[torch.Tensor]
    kd: Optional[torch.Tensor]
    hidden: Optional[torch.Tensor]
    path: str


def _final_norm(model: nn.Module) -> nn.Module:
    norm = getattr(model.get_decoder(), "norm", None)
    if not isinstance(norm, nn.Module):
        raise ValueError(f"model: {type(model).__name__} has no final norm at get_decoder().norm; the fused losses "
                         "read the final hidden states there")
    return norm


def _softcap(model: nn.Module) -> Optional[float]:
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return getattr(cfg, "final_logit_softcapping", None)


def _forward(model: nn.Module, batch: dict[str, torch.Tensor], states: bool):
    """``(final hidden [B, T, D], per-layer hidden states or None)`` of one forward with no logits made."""
    caught = {}
    handle = _final_norm(model).register_forward_hook(lambda module, args, out: caught.__setitem__("h", out))
    ids = batch["input_ids"]
    none = torch.empty(0, dtype=torch.long, device=ids.device)  # logits_to_keep: no position reaches the head
    try:
        out = model(input_ids=ids, attention_mask=batch.get("attention_mask"), logits_to_keep=none,
                    output_hidden_states=states, use_cache=False)
    finally:
        handle.remove()
    return caught["h"], (out.hidden_states[1:] if states else None)


def hidden_match_loss(student: tuple, teacher: tuple, mask: Optional[torch.Tensor], eps: float = 1e-6) -> torch.Tensor:
    """Mean over layers of the token-mean MSE between RMS-normalised hidden states.

    Args:
        student: Per layer ``[B, T, D]`` hidden states of the student.
        teacher: The teacher's, same shapes.
        mask: ``[B, T]`` tokens that count (``None``: all).
    """

    def rms(h: torch.Tensor) -> torch.Tensor:
        h = h.float()
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)

    w = None if mask is None else mask.float()
    out = []
    for s, t in zip(student, teacher):
        per_token = (rms(s) - rms(t)).pow(2).mean(-1)  # [B, T]
        out.append(per_token.mean() if w is None else (per_token * w).sum() / w.sum().clamp_min(1.0))
    return torch.stack(out).mean()


def objective(model: nn.Module, batch: dict[str, torch.Tensor], cfg: LossConfig) -> Objective:
    """Runs the teacher (if ``cfg`` needs it, first: its stats are not recorded) and the routed student on ``batch``
    (``input_ids [B, T]``, optional ``attention_mask`` and ``labels`` with ``-100`` where not counted) and returns
    the weighted loss. Next-token terms count the positions whose next label is not ``-100``, as HF's loss."""
    ids = batch["input_ids"]
    labels = batch.get("labels", ids)
    states = cfg.hidden > 0
    t_final = t_states = None
    if cfg.uses_teacher:
        with teacher_mode(model):
            t_final, t_states = _forward(model, batch, states)
    final, s_states = _forward(model, batch, states)
    head = model.get_output_embeddings()
    d = final.shape[-1]
    targets = labels[:, 1:].reshape(-1)
    kd = cfg.kd
    parts = LossParts(final.new_zeros((), dtype=torch.float32), None, None, "none")
    if cfg.lm > 0 or kd > 0:
        parts = fused_linear_loss(
            final[:, :-1].reshape(-1, d), head.weight, targets,
            teacher_hidden=t_final[:, :-1].reshape(-1, d) if kd > 0 else None, lm=cfg.lm, kd=kd,
            temperature=cfg.temperature, bias=getattr(head, "bias", None), softcap=_softcap(model),
            backend=cfg.backend, chunk_size=cfg.chunk_size)
    total, match = parts.total, None
    if states:
        match = hidden_match_loss(s_states, t_states, batch.get("attention_mask"))
        total = total + cfg.hidden * match
        match = match.detach()
    return Objective(total, parts.lm, parts.kd, match, parts.path)


def lm_loss(model: nn.Module, batch: dict[str, torch.Tensor], backend: str = "auto",
            chunk_size: Optional[int] = None) -> torch.Tensor:
    """Mean next-token cross-entropy of ``batch`` through the fused head (HF's ``out.loss``, logits never whole)."""
    return objective(model, batch, LossConfig(lm=1.0, backend=backend, chunk_size=chunk_size)).total


def counted_tokens(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Number of next-token positions :func:`objective` averages over."""
    labels = batch.get("labels", batch["input_ids"])
    return (labels[:, 1:] != IGNORE_INDEX).sum()
