"""Kernel tests run Triton through its CPU interpreter when no GPU is present.

Triton decides interpreted-or-compiled when a function is decorated with ``@triton.jit``. `wide.kernels`
imports its kernel modules only on first use, so setting TRITON_INTERPRET here is early enough for
*our* kernels. Triton's own standard library (``tl.sum``, ``tl.max``, ``tl.sigmoid``...) is decorated
when Triton is imported, and the root conftest's ``import wide`` already imports Triton (through
transformers -> torch._dynamo); if that happened without the variable, those functions are compiled-mode
objects the interpreter cannot call, so we swap in interpreted twins. ``test_interpreter_is_active``
checks the result.
"""

import os
import sys

import torch


def _reinterpret_triton_stdlib() -> None:
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    twins: dict[int, object] = {}
    for mod in (tl, tl.core, tl.standard, tl.math):
        for name, obj in list(vars(mod).items()):
            if isinstance(obj, JITFunction):
                twin = twins.setdefault(id(obj), InterpretedFunction(obj.fn))
                setattr(mod, name, twin)


if not torch.cuda.is_available():
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        os.environ["TRITON_INTERPRET"] = "1"
        if "triton" in sys.modules:
            _reinterpret_triton_stdlib()
