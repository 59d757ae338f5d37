"""`KernelOptions.decode_qkv`: a decode step over a static cache runs a routed Llama / Qwen2 attention's q / k / v,
RoPE and cache write as one `decode_qkv` call (`wide.modeling.fused_attention`); logits, cache and tokens are those
of transformers' own forward."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import wide
import wide.kernels
from tests.conftest import tiny_model
from wide.kernels import use_kernel_options
from wide.modeling import fused_attention
from wide.modeling.inference import enable_kernels, set_kernels

ROOT = Path(__file__).resolve().parents[2]


UNFUSED = dict(decode_qkv=False, decode_residual=False)
"""The kernel options of the separate launches, a test's reference side (the fused decode launches are on by
default)."""


def _routed(arch="llama", backend="torch", **sizes):
    model = tiny_model(arch, **sizes)
    wide.apply_wide(model, wide.WideConfig(sparsity=0.5, router="lowrank", attn_group_size=2, ffn_group_size=32))
    return enable_kernels(model.eval(), backend)


@pytest.fixture
def calls(monkeypatch):
    """The ``[B, 1, K]`` inputs of every `decode_qkv` call."""
    seen = []
    real = wide.kernels.decode_qkv

    def spy(x, *a, **k):
        seen.append(tuple(x.shape))
        return real(x, *a, **k)

    monkeypatch.setattr(wide.kernels, "decode_qkv", spy)
    return seen


def _static_steps(model, ids, steps=3, feed=None):
    """Prefill over a static cache, then ``steps`` decode steps, greedy or feeding ``feed [B, steps]`` (a random
    model's near-tied logits flip a bf16 argmax): (every step's logits, the cache's keys and values of every layer,
    its write positions)."""
    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=ids.shape[1] + steps + 2)
    logits = []
    with torch.no_grad():
        out = model(ids, past_key_values=cache, use_cache=True)
        logits.append(out.logits[:, -1])
        nxt = out.logits[:, -1:].argmax(-1)
        for i in range(steps):
            out = model(nxt if feed is None else feed[:, i:i + 1], past_key_values=cache, use_cache=True)
            logits.append(out.logits[:, -1])
            nxt = out.logits[:, -1:].argmax(-1)
    kv = [t.clone() for layer in cache.layers for t in (layer.keys, layer.values)]
    return torch.stack(logits), kv, [int(layer.cumulative_length) for layer in cache.layers]


def unfused_then_fused(model, ids, spied: list, base: dict = UNFUSED, **fused):
    """Decode steps with the kernel options ``base`` (the separate launches: the spy list ``spied`` stays empty),
    then with ``fused`` on top of them; returns both `_static_steps` results."""
    with use_kernel_options(**base):
        off = _static_steps(model, ids)
        assert not spied, "the separate launches ran a fused one"
        with use_kernel_options(**fused):
            on = _static_steps(model, ids)
    return off, on


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_decode_steps_fuse_and_match_transformers(arch, calls):
    model = _routed(arch)
    assert all(fused_attention.INNER in vars(layer.self_attn) for layer in model.model.layers)
    ids = torch.randint(3, 96, (3, 6), generator=torch.Generator().manual_seed(0))
    off, on = unfused_then_fused(model, ids, calls, decode_qkv=True)
    assert calls == [(3, 1, 64)] * 3 * model.config.num_hidden_layers, "one call per layer and decode step"
    torch.testing.assert_close(on[0], off[0], rtol=1e-5, atol=1e-5)
    for a, b in zip(on[1], off[1]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert on[2] == off[2] == [6 + 3] * model.config.num_hidden_layers
    set_kernels(model, False)  # the reference path (masked dense compute): the same greedy tokens
    ref = _static_steps(model, ids)
    assert len(calls) == 3 * model.config.num_hidden_layers, "the reference path runs no fused launch"
    assert torch.equal(ref[0].argmax(-1), off[0].argmax(-1))


def test_generate_with_a_static_cache_keeps_the_tokens(calls):
    model = _routed("qwen2")
    ids = torch.randint(3, 96, (2, 5), generator=torch.Generator().manual_seed(1))
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=5, min_new_tokens=5, do_sample=False,
              cache_implementation="static")
    with use_kernel_options(**UNFUSED):
        off = model.generate(ids, **kw)
        assert not calls
    on = model.generate(ids, **kw)  # the defaults
    assert len(calls) == 4 * model.config.num_hidden_layers and torch.equal(on, off)


def test_other_steps_and_modules_take_the_own_forward(calls):
    model = _routed("qwen3")
    attn = model.model.layers[0].self_attn
    assert not fused_attention.supported(attn) and fused_attention.INNER not in vars(attn)  # q / k norms
    model = _routed("llama")
    ids = torch.randint(3, 96, (2, 6), generator=torch.Generator().manual_seed(2))
    with use_kernel_options(decode_qkv=True), torch.no_grad():
        out = model(ids, use_cache=True)  # a prefill, then a decode step over a dynamic cache
        model(ids[:, -1:], past_key_values=out.past_key_values)
        # (routing off fuses the dense step, every q head: tests/modeling/test_fused_route.py)
        model.train()
        _static_steps(model, ids, 1)
    assert not calls


def test_triton_interpreter_matches_the_unfused_kernels():
    """fp32 tiny Llama and Qwen2 (head dim 32) through the Triton kernels (CPU interpreter), batch 1: one fused
    launch per layer and decode step, the logits, cache and tokens of the unfused kernels."""
    run_interpreted("""
        from tests.modeling.test_fused_attention import _static_steps, tiny_triton_model
        from wide.kernels import get_backend, use_kernel_options
        from wide.kernels.triton import decode_qkv
        assert get_backend("triton").is_available()
        for arch in ("llama", "qwen2"):
            m = tiny_triton_model(arch)
            ids = torch.randint(3, 96, (1, 5))  # batch 1: the triton launch's
            with use_kernel_options(decode_qkv=False):
                off = _static_steps(m, ids, 2)
            launches = []
            real = decode_qkv._decode_qkv_kernel
            class Spy:
                def __getitem__(self, grid):
                    launches.append(grid)
                    return real[grid]
            decode_qkv._decode_qkv_kernel = Spy()
            on = _static_steps(m, ids, 2)  # the defaults
            decode_qkv._decode_qkv_kernel = real
            assert len(launches) == 2 * 2, launches
            torch.testing.assert_close(on[0], off[0], rtol=1e-4, atol=1e-4)
            for a, b in zip(on[1], off[1]):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
            assert on[2] == off[2] and torch.equal(on[0].argmax(-1), off[0].argmax(-1))
        print("OK")
        """)


GPU_LAYOUTS = [
    pytest.param("llama", dict(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3,
                               head_dim=64), id="smollm2"),
    pytest.param("qwen2", dict(hidden_size=1536, intermediate_size=1024, num_attention_heads=12,
                               num_key_value_heads=2, head_dim=128), id="qwen2.5"),  # Qwen2.5-1.5B's attention
]
"""The GPU tests' layouts of the fused decode paths (SmolLM2's and Qwen2.5-1.5B's head shapes)."""


def gpu_routed(arch: str, layout: dict, batch: int, seed: int):
    """A 3-layer bf16 routed model on the GPU (triton kernels), a 9-token prompt and 4 tokens to feed after it."""
    model = tiny_model(arch, num_hidden_layers=3, vocab_size=512, **layout).cuda().to(torch.bfloat16)
    wide.apply_wide(model, wide.WideConfig(sparsity=0.5, router="lowrank", attn_group_size=1, ffn_group_size=64))
    enable_kernels(model.eval(), "triton")
    gen = torch.Generator().manual_seed(seed)
    return model, torch.randint(3, 512, (batch, 9), generator=gen).cuda(), \
        torch.randint(3, 512, (batch, 4), generator=gen).cuda()


def tiny_triton_model(arch: str, layers: int = 2):
    """The interpreter tests' model: a tiny fp32 routed ``arch`` (head dim 32) on the triton backend."""
    m = tiny_model(arch, num_hidden_layers=layers, hidden_size=96, num_attention_heads=4, num_key_value_heads=2,
                   head_dim=32)
    wide.apply_wide(m, wide.WideConfig(router="lowrank", attn_group_size=1, ffn_group_size=32))
    return enable_kernels(m, "triton")


def interpreted_options_match(archs, rows, base: dict, extra: dict, layers: int = 2) -> None:
    """In the Triton interpreter (a fresh process): each ``arch``'s decode-step logits and cache positions with the
    kernel options ``extra`` on top of ``base`` are those with ``base`` alone (fp32, 1e-4), at each row count."""
    run_interpreted(f"""
        from tests.modeling.test_fused_attention import _static_steps, tiny_triton_model
        from wide.kernels import get_backend, use_kernel_options
        assert get_backend("triton").is_available()
        for arch in {tuple(archs)!r}:
            m = tiny_triton_model(arch, {layers})
            for rows in {tuple(rows)!r}:
                ids = torch.randint(3, 96, (rows, 5))
                with use_kernel_options(**{base!r}):
                    off = _static_steps(m, ids, 2)
                    with use_kernel_options(**{extra!r}):
                        on = _static_steps(m, ids, 2)
                torch.testing.assert_close(on[0], off[0], rtol=1e-4, atol=1e-4)
                assert on[2] == off[2]
        print("OK")
        """)


def run_interpreted(body: str) -> None:
    """Runs ``body`` (Python, its last line printing OK) in a fresh process with the Triton interpreter on."""
    script = "import sys, torch, wide\nsys.path.insert(0, %r)\n" % str(ROOT) + textwrap.dedent(body)
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0 and "OK" in res.stdout, res.stderr[-3000:]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("arch, layout", GPU_LAYOUTS)
@pytest.mark.parametrize("batch", [1, 5])  # 5 rows: one 16-row `tl.dot` tile per head
@pytest.mark.parametrize("overlap", [True, False], ids=["dense-q-beside-the-router", "routed-q-after-it"])
def test_gpu_bf16_fused_decode_gives_the_unfused_logits_cache_and_tokens(arch, layout, batch, overlap):
    """bf16 on the GPU, every layer's masks fixed (forced, random per row): the fused launch rounds otherwise than
    transformers' eager path (RoPE once, its own GEMV order), and a random router's near-zero margin flipped by one
    ulp moves a tiny model's logits far (2026-12-03: 2-16% of them). With the same masks on both sides the test
    compares the numerics; the routers' own decisions through the fused path are the CPU tests' (fp32)."""
    model, ids, feed = gpu_routed(arch, layout, batch, seed=5)
    wide.set_overlap_routing(model, overlap)
    gen = torch.Generator().manual_seed(11)
    for layer in model.model.layers:
        for kind, slot in layer.wide.slots.items():
            layer.wide.forced[kind] = (torch.rand(batch, 1, slot.num_groups, generator=gen) < 0.5).float().cuda()
    try:
        with use_kernel_options(**UNFUSED):
            off = _static_steps(model, ids, 4, feed)
            tokens_off = wide.generate(model, ids, max_new_tokens=8)
        with use_kernel_options(decode_qkv=True, decode_residual=False):
            on = _static_steps(model, ids, 4, feed)
        torch.testing.assert_close(on[0], off[0], rtol=3e-2, atol=3e-2)
        for a, b in zip(on[1], off[1]):  # bf16 caches: RoPE rounded once here, per product in eager transformers
            torch.testing.assert_close(a, b, rtol=3e-2, atol=3e-2)
        assert on[2] == off[2]
        with use_kernel_options(decode_qkv=True, decode_residual=False):
            tokens_on = wide.generate(model, ids, max_new_tokens=8)  # CUDA graphs: the fused launch captured
        assert_same_greedy(model, tokens_on, tokens_off, ids.shape[1] + 8)
    finally:
        for layer in model.model.layers:
            layer.wide.forced = {}


def assert_same_greedy(model, tokens_on, tokens_off, upto: int, tol: float = 3e-2) -> None:
    """The greedy tokens agree up to ``upto``, except where the unfused side's own choice was a near-tie: at the
    first difference, its logits (a forward over its prefix) rate the two tokens within ``tol`` (bf16 noise of a
    random tiny model's logits, the tolerance of the logits checks; each side's later tokens follow its own)."""
    assert tokens_on.shape == tokens_off.shape
    for row in range(tokens_on.shape[0]):
        diff = (tokens_on[row, :upto] != tokens_off[row, :upto]).nonzero()
        if len(diff):
            i = int(diff[0])
            with torch.no_grad():
                logits = model(tokens_off[row:row + 1, :i]).logits[0, -1].float()
            gap = (logits[tokens_off[row, i]] - logits[tokens_on[row, i]]).abs().item()
            assert gap < tol, f"row {row}: token {i} differs ({int(tokens_on[row, i])} vs {int(tokens_off[row, i])})"\
                f" where the unfused logits differ by {gap:.3f}"


def test_bf16_decode_rounds_rope_as_the_module_does(monkeypatch):
    """In 16-bit, RoPE rounded once (compiled glue) and per product (eager transformers) differ by an ulp, enough to
    move a router's near-zero margin across zero (2026-12-03: a random Qwen layout's first greedy token). The fused
    launch rounds as the module's own RoPE would: here eager, so the bf16 decode steps on the torch reference path
    are the unfused ones bit for bit; under `fuse_glue`'s inductor RoPE, once."""
    seen = []
    real = wide.kernels.decode_qkv

    def spy(*a, eager_rope=False, **k):
        seen.append(eager_rope)
        return real(*a, eager_rope=eager_rope, **k)

    monkeypatch.setattr(wide.kernels, "decode_qkv", spy)
    model = _routed("qwen2").to(torch.bfloat16)
    ids = torch.randint(3, 96, (2, 6), generator=torch.Generator().manual_seed(3))
    off, on = unfused_then_fused(model, ids, seen, decode_qkv=True)
    assert seen and all(seen)
    assert torch.equal(on[0], off[0]) and all(torch.equal(a, b) for a, b in zip(on[1], off[1]))
    rope = sys.modules[type(model.model.layers[0].self_attn).__module__].apply_rotary_pos_emb
    monkeypatch.setattr(rope, "_wide_backend", "inductor", raising=False)
    seen.clear()
    with use_kernel_options(decode_qkv=True):
        _static_steps(model, ids, 1)
    assert seen and not any(seen)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("arch, layout", GPU_LAYOUTS)
@pytest.mark.parametrize("batch", [1, 5])
def test_gpu_split_launch_beside_the_router_gives_the_one_launch_steps(arch, layout, batch, monkeypatch):
    """`KernelOptions.decode_qkv_split`: with the attention router on its side stream, k / v and the cache are written
    beside it (``part="kv"``) and the q heads the rows run after it (``part="q"``); the routers' own decisions (fp32),
    logits, caches and positions are those of the one launch that computes every q head."""
    model, ids, feed = gpu_routed(arch, layout, batch, seed=7)
    model.float()
    wide.set_overlap_routing(model, True)
    parts = []
    real = wide.kernels.decode_qkv

    def spy(*a, part="all", **k):
        parts.append(part)
        return real(*a, part=part, **k)

    monkeypatch.setattr(wide.kernels, "decode_qkv", spy)
    with use_kernel_options(decode_qkv=True, decode_residual=False):
        one = _static_steps(model, ids, 4, feed)
        assert parts and set(parts) == {"all"}
        parts.clear()
        with use_kernel_options(decode_qkv_split=True):
            two = _static_steps(model, ids, 4, feed)
    assert parts and set(parts) == {"kv", "q"} and parts[::2] == ["kv"] * (len(parts) // 2)
    torch.testing.assert_close(two[0], one[0], rtol=1e-4, atol=1e-4)
    for a, b in zip(two[1], one[1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert two[2] == one[2]
