"""What the Triton op families share: the GEMM launch config, element-size helpers, device facts (SM count, the
interpreter, stream capture), persistent-grid sizes and the arrival counters.

No Triton import here: the ``triton`` backend's verifiers read it (``import wide.kernels`` stays free of Triton).
"""

from __future__ import annotations

import dataclasses
import os

import torch


def rows_and_out(x: torch.Tensor, n: int, out: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """A host function's start: ``x [..., K]`` as rows ``[M, K]``, and the output ``[..., n]`` (``out`` or new)."""
    return x.reshape(-1, x.shape[-1]), (out if out is not None else x.new_empty(*x.shape[:-1], n))


def column_major(weight: torch.Tensor) -> bool:
    """Whether ``weight [N, K]`` is stored column-major (``stride == (1, N)``, `wide.set_weight_layout`): each input
    channel's column is contiguous, so a column group (the unit gemm_k skips) is one contiguous block."""
    return weight.dim() == 2 and weight.stride(0) == 1 and weight.stride(1) != 1


def interpreting() -> bool:
    """Whether Triton runs through its CPU interpreter (``TRITON_INTERPRET=1``: the test suite's mode)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def capturing(t: torch.Tensor) -> bool:
    """Whether ``t``'s stream is being captured into a CUDA graph (no host reads allowed then)."""
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


_SMS: dict = {}  # CUDA device index -> SM count (asked per persistent launch; the properties call is not free)


def sm_count(device: torch.device) -> int:
    """SM count of a CUDA device (cached: decode launches ask per call)."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    sms = _SMS.get(idx)
    if sms is None:
        sms = _SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return sms


def programs(device: torch.device, per_sm: int) -> int:
    """Programs of a persistent grid: ``per_sm`` per SM (a few under the interpreter)."""
    if interpreting() or device.type != "cuda":
        return 3  # the interpreter: a few programs, each striding over several tiles
    return sm_count(device) * per_sm


_COUNTERS: dict = {}
_RETIRED: list = []  # outgrown counter buffers: a captured CUDA graph may still point at one, so never freed


def arrival_counters(device: torch.device, n: int, owner: str = "") -> torch.Tensor:
    """At least ``n`` int32 counters on ``device``, zero between launches: kernels whose programs meet at
    a counter (the last to arrive finishes the work) reset their own. One set per device and ``owner``, so
    kernels of one owner must not run concurrently on two streams of one device; a kernel that runs beside the
    others (`decode_qkv`, beside the attention router on its side stream) takes its own ``owner``.

    The buffer is made (zeroed) eagerly: under CUDA-graph capture a new buffer's zeroing would only be
    recorded, not run, so a capture that needs a new or larger buffer is refused — warm up first (an eager
    call of the same op, as every capture needs anyway for Triton's compilation).
    """
    key = (device, owner)
    cnt = _COUNTERS.get(key)
    if cnt is None or cnt.numel() < n:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("wide.kernels: the arrival counters of gemm_k / router_margin are made on the first "
                               "eager call; run the op once eagerly (a warm-up) before capturing a CUDA graph")
        if cnt is not None:
            _RETIRED.append(cnt)
        cnt = _COUNTERS[key] = torch.zeros(max(n, 4096), device=device, dtype=torch.int32)
    return cnt


@dataclasses.dataclass(frozen=True)
class GemmConfig:
    """Launch configuration for one routed GEMM call (tests pass tiny ones; defaults are tuned)."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    group_m: int = 8
    split_k: int = 1
    # gemm_k: "" = affine K loop with masked loads, "list" = the plan's needed-group list, "local" = each token
    # tile's needed-group list built inside the kernel (no launch before it), "premask" = mask pass + cuBLAS,
    # "sorted" = pattern-sorted tokens with per-tile group lists (gemm_k_sorted)
    variant: str = ""
    # skinny tiles (direct gemm_mn, gemm_k; block_m > 1): compute the transposed tile, weights as the MMA's
    # M side (block_n rows) and the tokens as its N side, so that block_n >= 64 takes Hopper's wgmma
    swap: bool = False
    # large-M gemm_mn / SwiGLU: > 0 = the persistent kernel over the active-tile list with this many programs
    # per SM (``_gemm_mn_tiles_kernel``)
    persistent: int = 0


def pow2_divisor(n: int, cap: int) -> int:
    """Largest power of two dividing ``n`` and not above ``cap``."""
    d = 1
    while d * 2 <= cap and n % (d * 2) == 0:
        d *= 2
    return d


def for_element_size(config: GemmConfig, element_size: int) -> GemmConfig:
    """A default config for operands of ``element_size`` bytes: the defaults are tuned (and checked against
    sm_90's shared memory, tests/kernels/test_sm90_compile.py) for 2-byte bf16 / fp16, so for fp32 the K
    chunk is halved and each pipeline stage holds the same bytes (an fp32 swiglu tile 16 x 128 x 128 at 4
    stages asked for 408 KiB and failed to launch on the H200). Explicit configs are never changed."""
    bk = config.block_k
    while element_size > 2 and bk > 16:
        bk //= 2
        element_size //= 2
    return config if bk == config.block_k else dataclasses.replace(config, block_k=bk)
