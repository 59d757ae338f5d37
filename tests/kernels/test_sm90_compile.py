"""Ahead-of-time compilation of every launched Triton kernel (routing, routed GEMMs, attention, plan, the fused
decode q / k / v launch, the FFN-as-experts helpers) for Hopper (sm_90) with Triton's NVIDIA backend, down to a cubin, on a machine without a GPU: catches what
the interpreter lets through (types, layouts, unsupported ops, shared memory beyond the SM's) before a
device run. Numerics are the interpreter tests' and the GPU tests' job.

Runs in one subprocess without ``TRITON_INTERPRET``: under the interpreter the kernels (and Triton's own
library functions, see conftest) are interpreted objects the compiler cannot take.

The routing kernels are compiled at fixed signatures. The others are compiled at what their launchers
actually launch on the H200: the subprocess replaces each ``@triton.jit`` kernel that gemm_mn.py, gemm_k.py,
attention.py and partition.py launch by a recorder, then calls the launchers with ``meta`` tensors (bf16
activations and weights, shapes of Llama-3-8B layers) and the default configs (``default_mn_config``,
``default_k_config``, ``default_prefill_config``, ``default_decode_config`` with the H200's 132 SMs),
passing the other arguments the way each op's host function (``gemm_mn.gemm_mn``, ...) does. Each recorded launch
gives the kernel's signature (its parameters bound to the launch's arguments: tensors ``*bf16``/``*fp32``/
``*i32``/``*u8``/``*u1`` as passed, ints ``i32``, floats ``fp32``), its constexprs and its warps/stages.
Each recorded launch compiles twice: as passed, and as Triton's launcher specialises it on the GPU (ints equal to
1 as constexprs; tensors, taken as 16-byte aligned, and ints divisible by 16 marked divisible by 16): the variant a
real launch takes, whose vectorised loads are pipelined through shared memory (a 128-wide transposed SwiGLU tile fit
as passed but needed 272 KiB specialised, 2026-12-08). The routing kernels, compiled at fixed signatures, only as
passed.

The fp32 cases compile what the backend launches for 4-byte operands (default configs passed through
``common.for_element_size``, the prefill config given the element size).

Cases: decode-sized (M=1/16, decode B=1/16) and prefill-sized (M=128..4096, T=2048/16384) calls of each
op, plus the constexpr branches the model's calls do not reach (activations, bias, K not a multiple of
BLOCK_K, split-K off, K chunks across narrow groups). `PATHS` lists the code paths that must be compiled.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

JOB = Path(__file__).with_name("sm90_compile_job.py")  # the compile job, run as a script

# code paths (constexpr branches) each kernel must be compiled with: name -> predicate over its constexprs
PATHS = {
    "router._router_margin_kernel": {"up": lambda c: c["HAS_UP"], "no up": lambda c: not c["HAS_UP"],
                                     "coherent one block": lambda c: c["COHERENT"] and c["BLOCK_J"] == c["BLOCK_GC"],
                                     "coherent j-blocks": lambda c: c["COHERENT"] and c["BLOCK_J"] < c["BLOCK_GC"],
                                     "split": lambda c: c["SPLIT"] > 1, "one program": lambda c: c["SPLIT"] == 1,
                                     "decide": lambda c: c["DECIDE"], "margin": lambda c: not c["DECIDE"],
                                     "norm split": lambda c: c["WRITE_NORM"] and c["SPLIT"] > 1,
                                     "norm one program": lambda c: c["WRITE_NORM"] and c["SPLIT"] == 1},
    "router._router_tail_kernel": {"up": lambda c: c["HAS_UP"], "no up": lambda c: not c["HAS_UP"],
                                   "hi / lo halves": lambda c: c["SPLIT"], "one h": lambda c: not c["SPLIT"],
                                   "decide": lambda c: c["DECIDE"], "margin": lambda c: not c["DECIDE"]},
    "coherent._coherent_kernel": {"fixed keep": lambda c: not c["ADAPTIVE"], "adaptive keep": lambda c: c["ADAPTIVE"],
                                "group list": lambda c: c["LIST"], "no list": lambda c: not c["LIST"],
                                "one block": lambda c: c["BLOCK_J"] == c["BLOCK_G"],
                                "j-blocks": lambda c: c["BLOCK_J"] < c["BLOCK_G"]},
    "gemm_mn._gemm_mn_direct_kernel": {
        "split-K": lambda c: c["SPLIT"] > 1, "split-K swiglu": lambda c: c["SPLIT"] > 1 and c["SWIGLU"],
        "GEMV split-K": lambda c: c["SPLIT"] > 1 and c["BLOCK_M"] == 1,
        "GEMV": lambda c: c["BLOCK_M"] == 1, "GEMV swiglu": lambda c: c["BLOCK_M"] == 1 and c["SWIGLU"],
        "GEMV ragged K": lambda c: c["BLOCK_M"] == 1 and not c["EVEN_K"],
        "tl.dot": lambda c: c["BLOCK_M"] > 1, "tl.dot swiglu": lambda c: c["BLOCK_M"] > 1 and c["SWIGLU"],
        "tl.dot ragged K": lambda c: c["BLOCK_M"] > 1 and not c["EVEN_K"],
        "swapped tile": lambda c: c["SWAP"], "swapped swiglu": lambda c: c["SWAP"] and c["SWIGLU"],
        "swapped split-K": lambda c: c["SWAP"] and c["SPLIT"] > 1,
        "swapped ragged K": lambda c: c["SWAP"] and not c["EVEN_K"],
        "bias": lambda c: c["HAS_BIAS"], **{f"act {a}": (lambda a: lambda c: c["ACT"] == a and not c["SWIGLU"])(a)
                                            for a in range(4)}},
    "gemm_mn._gemm_mn_perm_kernel": {
        "swiglu": lambda c: c["SWIGLU"], "ragged K": lambda c: not c["EVEN_K"], "bias": lambda c: c["HAS_BIAS"],
        **{f"act {a}": (lambda a: lambda c: c["ACT"] == a and not c["SWIGLU"])(a) for a in range(4)}},
    "gemm_mn._gemm_mn_tiles_kernel": {
        "swiglu": lambda c: c["SWIGLU"], "ragged K": lambda c: not c["EVEN_K"], "bias": lambda c: c["HAS_BIAS"],
        "256-wide tiles": lambda c: c["BLOCK_N"] == 256, "groups of several tiles": lambda c: c["GROUP"] > c["BLOCK_N"],
        **{f"act {a}": (lambda a: lambda c: c["ACT"] == a and not c["SWIGLU"])(a) for a in range(4)}},
    "gemm_k._gemm_k_kernel": {
        "GEMV plan's group list": lambda c: c["BLOCK_M"] == 1 and c["USE_LIST"] and not c["LOCAL_LIST"],
        "GEMV tile's group list": lambda c: c["BLOCK_M"] == 1 and c["LOCAL_LIST"],
        "tl.dot plan's group list": lambda c: c["BLOCK_M"] > 1 and c["USE_LIST"] and not c["LOCAL_LIST"],
        "tl.dot tile's group list": lambda c: c["BLOCK_M"] > 1 and c["LOCAL_LIST"],
        "GEMV affine": lambda c: c["BLOCK_M"] == 1 and not c["USE_LIST"],
        "tl.dot chunk in one group": lambda c: c["BLOCK_M"] > 1 and c["GROUP"] % c["BLOCK_K"] == 0,
        "tl.dot chunk across groups": lambda c: c["BLOCK_M"] > 1 and c["GROUP"] % c["BLOCK_K"] != 0,
        "swapped list": lambda c: c["SWAP"] and c["USE_LIST"], "swapped affine": lambda c: c["SWAP"] and not c["USE_LIST"],
        "route epilogue, warm tail": lambda c: c["ROUTE"] and c["R_WARM"],
        "split-K, finished in-kernel": lambda c: c["SPLIT"] > 1, "no split-K, bias": lambda c: c["SPLIT"] == 1 and c["HAS_BIAS"],
        "residual": lambda c: c["HAS_RES"] and not c["ROUTE"],
        "route split-K": lambda c: c["ROUTE"] and c["SPLIT"] > 1,
        "route no split": lambda c: c["ROUTE"] and c["SPLIT"] == 1},
    "gemm_k._gemm_k_sorted_kernel": {"x masked": lambda c: c["X_MASKED"], "mask loads": lambda c: not c["X_MASKED"],
                                   "split-K": lambda c: c["SPLIT"] > 1, "bias": lambda c: c["HAS_BIAS"]},
    "gemm_k._mask_columns_kernel": {"any": lambda c: True},
    "gemm_mn._mask_epilogue_kernel": {"swiglu": lambda c: c["SWIGLU"],
                                   **{f"act {a}": (lambda a: lambda c: c["ACT"] == a and not c["SWIGLU"])(a)
                                      for a in range(4)}},
    "attention._prefill_kernel": {"causal": lambda c: c["CAUSAL"], "non-causal": lambda c: not c["CAUSAL"],
                                  "lengths": lambda c: c["HAS_LEN"], "no lengths": lambda c: not c["HAS_LEN"],
                                  "GQA packing": lambda c: c["HU"] > 1,
                                  "padded heads": lambda c: c["HU_P"] > c["HU"]},
    "attention._decode_split_kernel": {"lengths": lambda c: c["HAS_LEN"], "no lengths": lambda c: not c["HAS_LEN"],
                                       "folded combine": lambda c: c["FOLD"],
                                       "folded combine, lengths": lambda c: c["FOLD"] and c["HAS_LEN"],
                                       "combine launch": lambda c: not c["FOLD"]},
    "attention._decode_reduce_kernel": {"lengths": lambda c: c["HAS_LEN"], "no lengths": lambda c: not c["HAS_LEN"]},
    "partition._partition_kernel": {"BLOCK 256": lambda c: c["BLOCK"] == 256, "BLOCK 1024": lambda c: c["BLOCK"] == 1024},
    "partition._group_list_kernel": {"one row": lambda c: c["BLOCK_M"] == 1, "row blocks": lambda c: c["BLOCK_M"] > 1},
    "experts._layout_kernel": {"any": lambda c: True},
    "experts._gather_rows_kernel": {"any": lambda c: True},
    "experts._gather_cols_kernel": {"any": lambda c: True},
    "experts._swiglu_rows_kernel": {"any": lambda c: True},
    "experts._combine_kernel": {"any": lambda c: True},
    "decode_qkv._decode_qkv_kernel": {"GEMV": lambda c: c["BLOCK_M"] == 1, "tl.dot rows": lambda c: c["BLOCK_M"] > 1,
                                      "mask": lambda c: c["HAS_MASK"], "every q head": lambda c: not c["HAS_MASK"],
                                      "split-K": lambda c: c["SPLIT"] > 1, "bias": lambda c: c["HAS_BIAS"],
                                      "eager RoPE": lambda c: c["EAGER_ROPE"],
                                      "q part (no cache, no bump)": lambda c: not c["BUMP"]},
}


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


@pytest.fixture(scope="module")
def compiled() -> subprocess.CompletedProcess:
    """One subprocess compiles every kernel (the tests below read their module's part)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    return subprocess.run([sys.executable, str(JOB)], env=env, capture_output=True, text=True, timeout=600)


def _check(res: subprocess.CompletedProcess, module: str) -> None:
    assert res.returncode == 0 and "RESULT " in res.stdout, res.stderr[-4000:]
    out = json.loads(res.stdout.split("RESULT ", 1)[1])
    kernels = [k for k in out["kernels"] if k.startswith(module + ".")]
    assert kernels, f"no launched @triton.jit kernel found in wide.kernels.triton.{module}"
    rows = [r for r in out["rows"] if r["kernel"].startswith(module + ".")]
    failures = [f"{e['case']} did not launch: {e['error']}" for e in out["errors"] if e["module"] == module]
    for r in rows:
        if r.get("error"):
            cfg = " ".join(f"{k}={v}" for k, v in {**r["constexprs"], "num_warps": r["num_warps"],
                                                   "num_stages": r["num_stages"]}.items())
            failures.append(f"{r['kernel']} does not compile for sm_90 [{r['case']}; {cfg}]:\n{r['error']}")
    for kernel in kernels:
        consts = [r["constexprs"] for r in rows if r["kernel"] == kernel]
        if kernel not in PATHS:
            failures.append(f"{kernel} is launched but has no entry in PATHS (add its cases and code paths)")
        missed = [p for p, pred in PATHS.get(kernel, {}).items() if not any(pred(c) for c in consts)]
        if missed:
            failures.append(f"{kernel}: no compiled case takes the code path(s) {missed} (compiled: {consts})")
    assert not failures, "\n\n".join(failures)


skip_without_toolchain = pytest.mark.skipif(_toolchain() is not None, reason=str(_toolchain()))


@skip_without_toolchain
def test_routing_kernels_compile_to_sm90_cubins(compiled):
    _check(compiled, "router")


@skip_without_toolchain
def test_gemm_mn_kernels_compile_to_sm90_cubins(compiled):
    _check(compiled, "gemm_mn")


@skip_without_toolchain
def test_gemm_k_kernels_compile_to_sm90_cubins(compiled):
    _check(compiled, "gemm_k")


@skip_without_toolchain
def test_attention_kernels_compile_to_sm90_cubins(compiled):
    _check(compiled, "attention")


@skip_without_toolchain
def test_partition_kernels_compile_to_sm90_cubins(compiled):
    _check(compiled, "partition")


@skip_without_toolchain
def test_decode_qkv_kernel_compiles_to_sm90_cubins(compiled):
    _check(compiled, "decode_qkv")


@skip_without_toolchain
def test_expert_kernels_compile_to_sm90_cubins(compiled):
    _check(compiled, "experts")
