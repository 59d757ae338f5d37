"""Where routed inference hooks into transformers modules without replacing them: a module's forward wrapped once,
the wrapped one kept under a name (`wide.modeling.normroute`, `fused_attention`, `fused_residual`)."""

from __future__ import annotations

import types
from typing import Callable

from torch import nn


def is_hf_form(module: nn.Module, forms: tuple[str, ...]) -> bool:
    """Whether ``module`` is one of the transformers classes named in ``forms`` (a form a wrapper reproduces)."""
    cls = type(module)
    return cls.__module__.startswith("transformers.models.") and cls.__name__ in forms


def wrap_forward(module: nn.Module, inner: str, forward: Callable, **attrs) -> bool:
    """Binds ``forward`` as ``module``'s forward, keeping the current one as ``module.<inner>`` and setting
    ``attrs`` (plain attributes, never submodules); once: ``False`` if ``module`` is already wrapped so."""
    if inner in vars(module):
        return False
    setattr(module, inner, module.forward)
    for name, value in attrs.items():
        object.__setattr__(module, name, value)
    module.forward = types.MethodType(forward, module)
    return True
