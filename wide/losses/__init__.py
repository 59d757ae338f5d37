"""Training losses: fused linear cross-entropy / distillation KL, the dense self-teacher, the objective."""

from wide.losses.fused import LossParts, fused_linear_loss
from wide.losses.objective import LossConfig, Objective, counted_tokens, hidden_match_loss, lm_loss, objective
from wide.losses.teacher import adapters_disabled, teacher_mode

__all__ = ["LossConfig", "LossParts", "Objective", "adapters_disabled", "counted_tokens", "fused_linear_loss",
           "hidden_match_loss", "lm_loss", "objective", "teacher_mode"]
