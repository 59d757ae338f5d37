"""Ahead-of-time compilation of the routing kernels for Hopper (sm_90) with Triton's NVIDIA backend, down
to a cubin, on a machine without a GPU: catches what the interpreter lets through (types, layouts,
unsupported ops) before a device run. Numerics are the interpreter tests' and the GPU tests' job.

Runs in a subprocess without ``TRITON_INTERPRET``: under the interpreter the kernels (and Triton's own
library functions, see conftest) are interpreted objects the compiler cannot take."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, os, sys, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from wide.kernels.triton import router

def compile_sm90(fn, signature, constexprs):
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})

done = []
for xdtype, wdtype in (("bf16", "fp32"), ("fp16", "bf16")):
    for has_up, decide in ((True, True), (True, False), (False, True)):
        sig = {"x_ptr": f"*{xdtype}", "down_ptr": f"*{wdtype}", "up_ptr": f"*{wdtype}", "bias_ptr": f"*{wdtype}",
               "out_ptr": "*u8" if decide else "*fp32", "D": "i32", "R": "i32", "G": "i32", "sxm": "i32",
               "sdr": "i32", "sug": "i32", "som": "i32", "eps": "fp32", "NORMALIZE": "constexpr",
               "HAS_UP": "constexpr", "HAS_BIAS": "constexpr", "DECIDE": "constexpr", "BLOCK_D": "constexpr",
               "BLOCK_R": "constexpr", "BLOCK_G": "constexpr"}
        consts = {"NORMALIZE": True, "HAS_UP": has_up, "HAS_BIAS": True, "DECIDE": decide, "BLOCK_D": 256,
                  "BLOCK_R": 32, "BLOCK_G": 128}
        k = compile_sm90(router._router_margin_kernel, sig, consts)
        done.append(("router_margin", xdtype, wdtype, has_up, decide, "cubin" in k.asm))
for mdtype in ("bf16", "fp32"):
    sig = {"m_ptr": f"*{mdtype}", "ema_ptr": "*fp32", "sel_ptr": "*u8", "step_ptr": "*i64", "B": "i32",
           "G": "i32", "smb": "i32", "weight": "fp32", "keep": "i32", "refresh_every": "i32",
           "BLOCK_G": "constexpr", "BLOCK_J": "constexpr"}
    k = compile_sm90(router._coherent_kernel, sig, {"BLOCK_G": 512, "BLOCK_J": 16})
    done.append(("coherent_select", mdtype, "cubin" in k.asm))
print("RESULT " + json.dumps(done))
"""


def _toolchain() -> str | None:
    if importlib.util.find_spec("triton") is None:
        return "needs triton"
    import triton

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    if not os.path.exists(ptxas):
        return f"this triton build ships no ptxas ({ptxas})"
    if importlib.util.find_spec("triton.compiler") is None:
        return "this triton has no AOT compiler API"
    return None


@pytest.mark.skipif(_toolchain() is not None, reason=str(_toolchain()))
def test_routing_kernels_compile_to_sm90_cubins():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    res = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    done = json.loads(res.stdout.split("RESULT ", 1)[1])
    assert len(done) == 8 and all(row[-1] for row in done), done
