"""A/B switches of the fused kernels' default launch configs, passed explicitly (no environment knobs).

The defaults are the tuned choices; a benchmark that compares against the previous config turns one off for a
block of calls (``with use_kernel_options(skinny_swap=False): ...``, or ``wide bench --kernel-option
skinny_swap=0``). Explicit launch configs (``config=`` on a backend's method) are never changed by them.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator, Sequence

from wide.registry import suggest


@dataclasses.dataclass(frozen=True)
class KernelOptions:
    """Switches of the triton backend's default configs (each ``True`` = the tuned default, but for the ones not
    yet measured on the H200, which default to ``False``)."""

    persistent_mn: bool = True
    """Prefill-sized gemm_mn / SwiGLU (M >= 1024, groups of >= 128) take the persistent kernel over the active
    tiles; ``False`` gives one program per tile back (``GemmConfig.persistent = 0``)."""
    skinny_swap: bool = True
    """Decode-sized GEMMs (M <= 16 gemm_mn / SwiGLU, M <= 32 gemm_k) compute transposed tiles (``GemmConfig.swap``,
    Hopper's wgmma); ``False`` gives the row tiles back."""
    decode_fold: bool = True
    """Decode attention with many (row, KV head) pairs combines its key splits in the last split program
    (``AttentionConfig.fold``); ``False`` keeps the second launch."""

    ffn_experts: bool = True
    """Prefill-sized routed FFNs with groups of >= 1024 channels run as experts (grouped GEMMs + a fixed-order
    combine, `wide.kernels.ffn_experts`); ``False`` keeps the per-tile swiglu + gemm_k path. End to end on the H200
    (8B shape, 50%, 2026-12-02, benchmarks/results/2026-12-02b-h200): FFN groups of 2048 1.50x / 1.53x at 4k / 16k
    prefill against 1.38x / 1.44x per tile; 1024 1.40x / 1.49x against 1.39x / 1.43x; 0% 0.98x / 0.99x."""

    gemm_k_experts: bool = False
    """Prefill-sized routed reduction-width GEMMs (`gemm_k`: ``o_proj`` with attention groups of whole KV-head
    units, >= 512 channels) run as experts: each pair's columns gathered, one grouped GEMM over the weight's column
    groups, the fixed-order combine (`wide.kernels.triton.experts.gemm_k_experts`); ``False`` keeps the per-tile
    path (at 50% with per-token masks it skips no block: dense speed). Off: on the H200 (2026-12-03, 8B shape, FFN
    groups of 2048 as experts, BENCHMARKS.md) the 8B ``o_proj`` (8 groups of 512) as experts was 0.85x / 1.04x of
    dense per call at M = 4096 / 16384, and end to end 1.49x against 1.50x (4k) and 1.53x against 1.52x (16k)."""

    decode_norm_route: bool = False
    """Decode steps (at most 64 rows) with per-token routing fuse each routed layer's RMSNorm (Llama / Qwen form)
    with its router: one `wide.kernels.rms_norm_route` launch writes the norm's output and the decisions, two
    launches a layer fewer (`wide.modeling.normroute`). Off until measured on the H200."""

    decode_qkv: bool = True
    """Decode steps over a transformers static cache run each routed layer's q / k / v projections, RoPE and cache
    write as one `wide.kernels.decode_qkv` launch instead of ~10 (`wide.modeling.fused_attention`; Llama / Qwen2
    attention). H200 2026-12-03: Qwen2.5-1.5B with trained routers, batch 1, 1.12x → 1.44x (BENCHMARKS.md). RoPE is
    rounded as the module's own path would (`wide.kernels.decode_qkv`'s ``eager_rope``). On by default since
    2026-12-03 (the decode tables of BENCHMARKS.md are measured with it on)."""

    decode_qkv_split: bool = False
    """With `decode_qkv`, a decode step whose attention router decides on its side stream runs the launch in two: k /
    v, RoPE, the cache write and the position bump beside the router (``part="kv"``), then the q heads the rows run
    once the mask is known (``part="q"``), instead of one launch computing every q head because the mask is not known
    yet. The 8B shape's every-head launch took 18.1 µs against 13.5 with half the q heads (2026-12-03 sweep); the
    second launch costs a launch. Off: end to end it is slower (H200 2026-12-05, 8B shape, 50%, batch 1: 3.49 ms
    against 3.37 without; batch 16 6.16 against 5.92; BENCHMARKS.md), the second launch and the wait for the router
    costing more than the skipped q heads save."""

    decode_residual: bool = True
    """Decode steps (at most 64 rows) of a routed Llama / Qwen2 decoder layer add the residual stream inside the
    routed ``o_proj`` / ``down_proj`` epilogues instead of two add launches (`wide.modeling.fused_residual`). H200
    2026-12-03, with `decode_qkv`: Qwen2.5-1.5B batch 1 1.44x → 1.51x; its bf16 GPU tests pass since the epilogue
    rounds the projection first. On by default since 2026-12-03, with `decode_qkv`."""

    decode_route: bool = False
    """With `decode_residual`, a batch-1 decode step's ``o_proj`` / ``down_proj`` launch also writes the next
    RMSNorm's output and the next router's decisions (`wide.kernels.gemm_k_route`): this layer's FFN, and the next
    layer's attention, then need no norm or router launch of their own, and the next layer's q projection knows its
    mask before it starts (`wide.modeling.fused_residual`). H200 2026-12-03 profiles (batch 1, µs a layer, against
    `decode_qkv` + `decode_residual`): SmolLM2 shape 46.1 → 41.9, 8B 149.6 → 145.1, Qwen 74.6 → 75.4 (the epilogue's
    serial norm and router tail); the 8B step end to end unchanged (3.54 → 3.56 ms). H100 2026-12-07, with
    `router_prefetch`, low-rank routers at the 8B shape: batch 1 at 50% 1.55x → 1.61x, at 75% 2.08x → 2.26x; but
    Qwen2.5-1.5B with its trained routers (26% of the attention groups skipped) 1.35x → 1.31x. Off: the one trained
    model measured loses."""

    decode_route_attn: bool = True
    """With `decode_route`, ``down_proj``'s launch also writes the next layer's ``input_layernorm`` output and
    attention decisions; ``False`` fuses only the FFN side (``o_proj``'s launch writes the FFN norm and decisions)
    and leaves the attention norm and router to their own launches, the router on its side stream beside
    `decode_qkv`'s k / v as without `decode_route`. Why a switch: the FFN router sits on the critical path between
    ``o_proj`` and the SwiGLU, so fusing it saves a serial launch, while the attention router overlaps on its side
    stream, so fusing it pays only through the q heads `decode_qkv` may then skip, against a serial norm + router tail
    in the epilogue. The H200 profile of 2026-12-03 put that trade at a loss on Qwen2.5-1.5B's shape (12 q heads in two
    groups: 4.7 MB of q) and a gain on the 8B shape (33.5 MB of q). Not measured yet with ``False``."""

    route_warm: bool = False
    """With `decode_route`, the fused epilogue's serial tail (the row's last tile: the partial sums, the next norm
    over the written row, the router's second stage) finds its operands in L2: each program of the launch first loads
    one element of a share of the 128-byte lines the tail reads (the norm's weight, the router's ``up`` and bias, its
    tile's columns of the router's ``down``; ``evict_last``), consumed by a store that never runs, and the norm runs
    in one trip up to 4096 columns instead of 1024-wide trips (4 at the 8B shape, 2 at Qwen2.5-1.5B's 1536; 46-56
    registers a thread either way, ptxas for sm_90). Why: the tail's loads come one after another, each a DRAM
    round trip when cold, and the tail cost about what the router launch it replaces did (H200 profile 2026-12-03:
    the two fused launches of a Qwen layer 15.2 -> 27.4 us). Same results bit for bit (the loads only warm the
    cache). Off until measured on a GPU."""

    attn_pack: bool = False
    """Prefill attention packs a unit's query heads into as many tile rows (``AttentionConfig.pack``) instead of a
    power of two: with 3 heads a unit (SmolLM2-135M) or 6 (Qwen2.5-1.5B) a quarter of every tile was dead padding,
    and packed a prompt takes about a quarter fewer tiles. Same results (parity tests). Off: measured on an H100
    (2026-12-06, T = 4096, 50%) at 48.1 vs 48.3 us (SmolLM2's heads) and 79.9 vs 81.0 us (Qwen's), no gain, as the KV
    loop, not the padded Q rows, sets a tile's time."""

    narrow_swiglu: bool = True
    """Prefill-sized SwiGLU at a narrow hidden size (K <= `gemm_mn.NARROW_K`, SmolLM2's 576) takes 128 x 64 tiles of
    4 warps, one program per tile (H100 sweep 2026-12-06: 30.0 vs 34.5 us at M = 4096, 50%); ``False`` gives the
    persistent 128 x 128 tiles back."""

    router_prefetch: bool = True
    """The decode router kernel (`wide.kernels.router_margin`, one launch a layer and kind) loads its second stage
    (``up`` over the rank and the bias, every group in one tile) in every program before the arrival atomic, so the
    row's last program runs the second GEMV without a memory round trip of its own. The serial tail after the atomic
    is what a low-rank router call waits on. The same margins to fp32 rounding: bit for bit in the interpreter, the
    last bits may differ on a GPU (H100, 2026-12-07), so a decision within ~1e-5 of its threshold may flip. On since
    2026-12-07: H100 graph replay, batch 1, low-rank routers at 50% (`profile_decode.py --router lowrank
    --kernel-option router_prefetch=0|1`), the router kernel 15.8 -> 13.8 us a layer and the routed step 182.4 ->
    180.6 us a layer at the 8B shape, 14.6 -> 12.1 and 82.5 -> 80.4 at Qwen2.5-1.5B's (dense/routed 1.50x -> 1.55x)."""

    def changed(self) -> dict[str, bool]:
        """The switches that differ from the defaults (what a benchmark records next to its timings)."""
        base = KernelOptions()
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) != getattr(base, f.name)}

    @classmethod
    def parse(cls, items: Sequence[str], flag: str = "--kernel-option") -> "KernelOptions":
        """``["persistent_mn=0", "skinny_swap=false"]`` -> options; a bad item raises one error naming ``flag``."""
        names = [f.name for f in dataclasses.fields(cls)]
        values: dict[str, bool] = {}
        for item in items:
            name, sep, raw = item.partition("=")
            name = name.strip()
            if name not in names:
                raise ValueError(f"{flag}: unknown kernel option {name!r}.{suggest(name, names)} "
                                 f"Options: {', '.join(names)}")
            value = {"1": True, "true": True, "on": True, "0": False, "false": False, "off": False}.get(
                raw.strip().lower())
            if not sep or value is None:
                raise ValueError(f"{flag}: {item!r} must be NAME=0 or NAME=1")
            values[name] = value
        return cls(**values)


_CURRENT = [KernelOptions()]


def kernel_options() -> KernelOptions:
    """The options routed calls run with now (the defaults unless a `use_kernel_options` block is open)."""
    return _CURRENT[-1]


@contextlib.contextmanager
def use_kernel_options(options: KernelOptions | None = None, **fields: bool) -> Iterator[KernelOptions]:
    """Run a block of routed calls with ``options`` (or the current ones with ``fields`` replaced).

    Process-wide, not per thread: the calls of one model run through one set of launch configs.
    """
    opts = dataclasses.replace(options or kernel_options(), **fields)
    _CURRENT.append(opts)
    try:
        yield opts
    finally:
        _CURRENT.pop()
