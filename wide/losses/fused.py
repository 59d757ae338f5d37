"""Fused linear + loss: next-token cross-entropy and distillation KL straight from final hidden states.

The language-model head's logits ``[N, V]`` are never materialised whole, in any dtype: tokens are cut into
chunks, each chunk's logits are made by the head matmul inside the loop, turned into the loss and the
gradient with respect to the chunk's hidden states in fp32, and dropped. The gradient is computed in the
forward (the loss is the last op of the graph), so the backward only scales it.

Two implementations of the same math:

- ``liger`` (Liger-Kernel, on CUDA): ``LigerFusedLinearCrossEntropyLoss`` for the LM term and
  ``LigerFusedLinearJSD`` with ``jsd_beta=0`` (Liger's convention: beta 0 is the forward KL(teacher ‖ student),
  beta 1 the reverse) for the distillation term; both skip the head's weight gradient when it is frozen.
- ``torch``: :class:`ChunkedLinearLoss` below, the pure-torch twin (any device; the CPU path, and the one used
  without Liger). One pass over each chunk serves both terms: 3 head matmuls per chunk with a teacher (student
  and teacher logits, the hidden-state gradient), where the two Liger ops run 5.

Reductions: both terms are means over the tokens whose label is not ``-100`` (HF's causal-LM loss); the KL is
summed over the vocabulary and scaled by ``T²`` so that its gradient keeps the size of the LM term's as the
temperature changes (Hinton et al.).
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

__all__ = ["BACKENDS", "ChunkedLinearLoss", "LossParts", "fused_linear_loss", "liger_available", "pick_backend"]

IGNORE_INDEX = -100
BACKENDS = ("auto", "liger", "torch")
CHUNK_ELEMENTS = 1 << 25
"""Logit elements per chunk of the torch path (32 Mi: 128 MiB per fp32 ``[chunk, V]`` buffer, a few live at once)."""

logger = logging.getLogger("wide.losses")
_logged: set[str] = set()


@dataclass
class LossParts:
    """What :func:`fused_linear_loss` returns.

    Attributes:
        total: The weighted loss, differentiable with respect to the student's hidden states.
        lm: Mean next-token cross-entropy (detached), or ``None`` when its weight is 0.
        kd: Mean KL(teacher ‖ student) at the temperature, before the ``T²`` scaling (detached), or ``None``.
        path: ``"liger"`` or ``"torch"``: the implementation that ran.
    """

    total: torch.Tensor
    lm: Optional[torch.Tensor]
    kd: Optional[torch.Tensor]
    path: str


def liger_available() -> bool:
    return importlib.util.find_spec("liger_kernel") is not None


def pick_backend(backend: str, device: torch.device, *, distill: bool, bias: bool, softcap: Optional[float]) -> str:
    """``liger`` or ``torch`` for one call: ``auto`` takes Liger on CUDA when it is installed and covers the call
    (no head bias or logit soft-capping with a teacher, which its fused JSD does not take)."""
    if backend not in BACKENDS:
        raise ValueError(f"loss.backend: must be one of {', '.join(BACKENDS)}, got {backend!r}")
    covered = not (distill and (bias or softcap is not None))
    if backend == "liger":
        if not liger_available():
            raise ValueError("loss.backend: 'liger' needs Liger-Kernel (pip install 'wide[liger]')")
        if not covered:
            raise ValueError("loss.backend: Liger's fused JSD takes no head bias or logit soft-capping; use 'torch'")
        return "liger"
    if backend == "torch":
        return "torch"
    return "liger" if device.type == "cuda" and liger_available() and covered else "torch"


def _log_once(path: str, why: str) -> None:
    if path not in _logged:
        _logged.add(path)
        logger.info("wide.losses: fused linear loss -> %s (%s)", path, why)


def fused_linear_loss(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *,
                      teacher_hidden: Optional[torch.Tensor] = None, lm: float = 1.0, kd: float = 0.0,
                      temperature: float = 1.0, bias: Optional[torch.Tensor] = None, softcap: Optional[float] = None,
                      backend: str = "auto", chunk_size: Optional[int] = None) -> LossParts:
    """``lm · CE(student) + kd · T² · KL(teacher ‖ student at T)``, head matmul fused in, logits never whole.

    Args:
        hidden: ``[N, D]`` the student's final (normed) hidden states, one row per predicting position.
        weight: ``[V, D]`` the LM head (shared by student and teacher: the same backbone).
        labels: ``[N]`` int64 next-token ids, ``-100`` where a position does not count.
        teacher_hidden: ``[N, D]`` the teacher's final hidden states (needed when ``kd > 0``).
        lm: Weight of the cross-entropy term.
        kd: Weight of the distillation term.
        temperature: Softmax temperature ``T`` of both distributions in the KL.
        bias: ``[V]`` head bias, if any.
        softcap: Final-logit soft-capping ``c · tanh(z / c)`` (Gemma-style), if the model applies one.
        backend: ``auto``, ``liger`` or ``torch`` (see the module docstring).
        chunk_size: Tokens per chunk of the torch path (default: about ``CHUNK_ELEMENTS / V``).
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"hidden {tuple(hidden.shape)} and weight {tuple(weight.shape)}: expected [N, D] and [V, D]")
    if labels.shape != hidden.shape[:1]:
        raise ValueError(f"labels: expected shape {(hidden.shape[0],)}, got {tuple(labels.shape)}")
    if kd > 0 and (teacher_hidden is None or teacher_hidden.shape != hidden.shape):
        raise ValueError("teacher_hidden: kd > 0 needs the teacher's hidden states, shaped like hidden")
    distill = kd > 0
    path = pick_backend(backend, hidden.device, distill=distill, bias=bias is not None, softcap=softcap)
    _log_once(path, f"backend={backend}, device={hidden.device.type}, teacher={'yes' if distill else 'no'}")
    if path == "liger":
        return _liger(hidden, weight, labels, teacher_hidden, lm, kd, temperature, bias, softcap)
    chunk = chunk_size or max(1, CHUNK_ELEMENTS // weight.shape[0])
    total, lm_mean, kd_mean = ChunkedLinearLoss.apply(hidden, weight, bias, teacher_hidden if distill else None,
                                                      labels, float(lm), float(kd), float(temperature), softcap,
                                                      int(chunk))
    return LossParts(total, lm_mean if lm > 0 else None, kd_mean if distill else None, "torch")


def _liger(hidden, weight, labels, teacher_hidden, lm, kd, temperature, bias, softcap) -> LossParts:
    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss, LigerFusedLinearJSD

    total = hidden.new_zeros((), dtype=torch.float32)
    lm_part = kd_part = None
    if lm > 0:
        ce = LigerFusedLinearCrossEntropyLoss(ignore_index=IGNORE_INDEX, reduction="mean", softcap=softcap)
        lm_part = ce(weight, hidden, labels, bias)
        total = total + lm * lm_part
    if kd > 0:
        jsd = LigerFusedLinearJSD(jsd_beta=0.0, ignore_index=IGNORE_INDEX, temperature=temperature)
        kd_part = jsd(hidden, weight, teacher_hidden.detach(), weight.detach(), labels)
        total = total + kd * temperature**2 * kd_part
    return LossParts(total, None if lm_part is None else lm_part.detach().float(),
                     None if kd_part is None else kd_part.detach().float(), "liger")


def _logits(h: torch.Tensor, weight: torch.Tensor, bias, softcap) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """fp32 logits ``[c, V]`` of one chunk (the matmul in the inputs' dtype, as the HF head runs it) and, with
    soft-capping, ``tanh(z / c)`` for its derivative."""
    z = F.linear(h, weight, bias).float()
    if softcap is None:
        return z, None
    t = torch.tanh(z / softcap)
    return t * softcap, t


class ChunkedLinearLoss(torch.autograd.Function):
    """The pure-torch fused linear loss (see the module docstring); returns ``(total, lm, kd)``, the last two
    detached means. Loss and gradients for one chunk of tokens at a time, so at most a few ``[chunk, V]`` fp32
    buffers are alive; the hidden-state (and, when the head trains, weight) gradients are written during the
    forward and scaled by the upstream gradient in the backward."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, teacher_hidden, labels, lm, kd, temperature, softcap, chunk):
        n = (labels != IGNORE_INDEX).sum().clamp_min(1).float()
        want_h = hidden.requires_grad
        want_w = weight.requires_grad
        want_b = bias is not None and bias.requires_grad
        grad_h = torch.zeros_like(hidden) if want_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_w else None
        grad_b = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if want_b else None
        lm_sum = hidden.new_zeros((), dtype=torch.float32)
        kd_sum = hidden.new_zeros((), dtype=torch.float32)
        T = temperature
        with torch.no_grad():
            for s in range(0, hidden.shape[0], chunk):
                h, y = hidden[s:s + chunk], labels[s:s + chunk]
                valid = (y != IGNORE_INDEX).unsqueeze(-1)  # [c, 1]
                z, tanh = _logits(h, weight, bias, softcap)
                grad = None
                if lm > 0:
                    logp = torch.log_softmax(z, dim=-1)
                    picked = logp.gather(-1, y.clamp_min(0).unsqueeze(-1))
                    lm_sum += -(picked * valid).sum()
                    # d CE / dz = softmax(z) - onehot(y), on counted rows
                    grad = logp.exp_()
                    grad.scatter_add_(-1, y.clamp_min(0).unsqueeze(-1), -torch.ones_like(picked))
                    grad.mul_(valid * (lm / n))
                    del logp
                if kd > 0:
                    zt, _ = _logits(teacher_hidden[s:s + chunk], weight, bias, softcap)
                    log_p = torch.log_softmax(zt.div_(T), dim=-1)  # teacher
                    log_q = torch.log_softmax(z / T, dim=-1)  # student
                    p = log_p.exp()
                    kd_sum += ((p * (log_p - log_q)).sum(-1, keepdim=True) * valid).sum()
                    # d (T² KL(p ‖ softmax(z / T))) / dz = T (q - p)
                    kd_grad = log_q.exp_().sub_(p).mul_(valid * (kd * T / n))
                    grad = kd_grad if grad is None else grad.add_(kd_grad)
                    del zt, log_p, log_q, p, kd_grad
                if grad is None or not (want_h or want_w or want_b):
                    continue
                if tanh is not None:
                    grad.mul_(1 - tanh * tanh)  # through c · tanh(z / c)
                if want_h:
                    grad_h[s:s + chunk] = grad.to(h.dtype) @ weight
                if want_w:
                    grad_w += grad.t() @ h.float()
                if want_b:
                    grad_b += grad.sum(0)
        lm_mean, kd_mean = lm_sum / n, kd_sum / n
        total = lm * lm_mean + kd * T * T * kd_mean
        ctx.save_for_backward(*(g for g in (grad_h, grad_w, grad_b) if g is not None))
        ctx.have = (want_h, want_w, want_b)
        ctx.dtypes = (hidden.dtype, weight.dtype, None if bias is None else bias.dtype)
        ctx.mark_non_differentiable(lm_mean, kd_mean)
        return total, lm_mean, kd_mean

    @staticmethod
    def backward(ctx, grad_total, _grad_lm, _grad_kd):
        saved = iter(ctx.saved_tensors)
        out = []
        for have, dtype in zip(ctx.have, ctx.dtypes):
            out.append((next(saved) * grad_total).to(dtype) if have else None)
        grad_h, grad_w, grad_b = out
        return grad_h, grad_w, grad_b, None, None, None, None, None, None, None
