"""Default launch configs adapt to the operand size (the shared-memory side is checked by test_sm90_compile)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from wide.kernels import KernelOptions  # noqa: E402
from wide.kernels.triton import gemm_k as tk  # noqa: E402
from wide.kernels.triton import gemm_mn as tm  # noqa: E402
from wide.kernels.triton.common import GemmConfig, for_element_size  # noqa: E402


def test_four_byte_operands_halve_the_k_chunk_and_keep_the_rest():
    cfg = GemmConfig(16, 128, 128, num_warps=4, num_stages=4, split_k=8, variant="list")
    assert for_element_size(cfg, 2) is cfg
    half = for_element_size(cfg, 4)
    assert (half.block_m, half.block_n, half.block_k) == (16, 128, 64)
    assert (half.num_warps, half.num_stages, half.split_k, half.variant) == (4, 4, 8, "list")


def test_the_k_chunk_never_drops_below_a_tensor_core_step():
    assert for_element_size(GemmConfig(16, 16, 16), 4).block_k == 16


def test_decode_attention_takes_the_all_heads_config_at_a_dense_hint(monkeypatch):
    """Many (row, kv head) pairs: 8 warps / 3 stages at about half the heads (or no hint), 4 warps / 2 stages
    when the router's rate says ~every head runs (H200 sweep, batch 16); few pairs ignore the hint."""
    from wide.kernels.triton import attention as ta

    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the GPU configs (the CPU's SM count stands in)
    half = ta.default_decode_config(16, 8, 4104, 128, "cpu", 0.5)
    none = ta.default_decode_config(16, 8, 4104, 128, "cpu")
    full = ta.default_decode_config(16, 8, 4104, 128, "cpu", 1.0)
    assert half == none and (half.num_warps, half.num_stages) == (8, 3)
    assert (full.num_warps, full.num_stages, full.splits) == (4, 2, half.splits)
    assert ta.default_decode_config(1, 8, 4104, 128, "cpu", 1.0) == ta.default_decode_config(1, 8, 4104, 128, "cpu")
    # few splits (many pairs): the combine folded into the split kernel; many splits keep the second launch
    assert half.fold and full.fold and not ta.default_decode_config(1, 8, 4104, 128, "cpu").fold
    assert not ta.default_decode_config(16, 8, 4104, 128, "cpu", 0.5, KernelOptions(decode_fold=False)).fold


def test_attention_decode_density_is_checked_and_passed_to_the_backend(monkeypatch):
    import torch

    import wide.kernels as wk
    from wide.kernels import get_backend

    q, kv = torch.randn(2, 1, 8, 16), torch.randn(2, 5, 2, 16)
    mask = torch.ones(2, 1, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="density"):
        wk.attention_decode(q, kv, kv, mask, density=1.5)
    seen = []
    tb = get_backend("triton")
    real = type(tb).attention_decode
    monkeypatch.setattr(type(tb), "attention_decode", lambda self, *a, density=None, **kw: seen.append(density)
                        or real(self, *a, density=density, **kw))
    ref = wk.attention_decode(q, kv, kv, mask, backend="torch", density=0.95)  # the reference takes no hint
    got = wk.attention_decode(q, kv, kv, mask, backend="triton", density=0.95)
    assert seen == [0.95]
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)


def test_decode_sized_gemms_take_the_transposed_tile_unless_switched_off(monkeypatch):
    """M <= 16 gemm_mn / SwiGLU and M <= 32 gemm_k default to ``swap`` (wgmma over 64 weight rows; H200 sweep
    2026-12-01); narrow gemm_k groups keep the row tiles; ``KernelOptions(skinny_swap=False)`` gives the row tiles
    back."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q = tm.default_mn_config(16, 4096, 4096, 512, False)[1]
    gu = tm.default_mn_config(16, 14336, 4096, 128, True)[1]
    down = tk.default_k_config(16, 4096, 14336, 128)
    assert q.swap and gu.swap and down.swap and down.variant == "list"
    assert (q.block_n, q.split_k, down.block_n, down.num_stages) == (64, 4, 64, 5)
    assert tk.affine_k_config(16, 4096, 14336, 128).swap
    assert not tk.default_k_config(16, 4096, 4096, 32).swap  # 32-wide groups: chunks span groups
    assert not tm.default_mn_config(1, 4096, 4096, 512, False)[1].swap  # the GEMV has no MMA
    assert not tm.default_mn_config(64, 4096, 4096, 512, False)[1].swap
    off = KernelOptions(skinny_swap=False)
    assert not any(c.swap for c in (tm.default_mn_config(16, 4096, 4096, 512, False, off)[1],
                                    tm.default_mn_config(16, 14336, 4096, 128, True, off)[1],
                                    tk.default_k_config(16, 4096, 14336, 128, off),
                                    tk.affine_k_config(16, 4096, 14336, 128, off)))


def test_column_major_weights_take_their_decode_configs(monkeypatch):
    """Decode gemm_k over a column-major weight (`wide.set_weight_layout`) takes `COLMAJOR_DECODE`'s tiles, their K
    chunk cut to the group (narrow groups: the affine loop's chunks across groups); prefill sizes keep theirs."""
    import torch

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert tk.column_major(torch.empty(64, 32).t()) and not tk.column_major(torch.empty(32, 64))
    for M, rows in ((1, 1), (16, 16), (5, 16)):
        for K, group in ((4096, 512), (14336, 128)):
            cfg = tk.default_k_config(M, 4096, K, group, colmajor=True)
            table = tk.COLMAJOR_DECODE[(rows, group >= 512)]
            assert (cfg.block_m, cfg.block_n, cfg.split_k) == (table.block_m, table.block_n, table.split_k)
            assert cfg.variant == ("local" if M == 1 else "list") and group % cfg.block_k == 0
            assert tk.affine_k_config(M, 4096, K, group, colmajor=True).variant == ""
    narrow = tk.default_k_config(1, 4096, 4096, 4, colmajor=True)  # chunks span the 4-wide groups
    assert narrow.variant == "" and narrow.block_k == tk.COLMAJOR_DECODE[(1, False)].block_k
    assert tk.default_k_config(64, 4096, 4096, 512, colmajor=True) == tk.default_k_config(64, 4096, 4096, 512)


def test_prefill_sized_gemm_mn_takes_the_persistent_kernel_unless_switched_off(monkeypatch):
    """From M = 1024 with groups of >= 128 (H200 sweep 2026-12-01): gate/up 128 x 128 tiles, q's 512-wide groups
    256-wide ones; narrow groups, smaller M and ``KernelOptions(persistent_mn=False)`` keep one program per tile."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    gu = tm.default_mn_config(4096, 14336, 4096, 128, True)
    q = tm.default_mn_config(1024, 4096, 4096, 512, False)
    assert gu[0] == q[0] == "perm" and gu[1].persistent == q[1].persistent == 1
    assert (gu[1].block_m, gu[1].block_n, q[1].block_n) == (128, 128, 256)
    assert not tm.default_mn_config(512, 14336, 4096, 128, True)[1].persistent
    assert not tm.default_mn_config(4096, 14336, 4096, 64, True)[1].persistent
    assert not tm.default_mn_config(4096, 14336, 4096, 128, True, KernelOptions(persistent_mn=False))[1].persistent


def test_narrow_hidden_swiglu_takes_the_small_per_tile_config(monkeypatch):
    """SwiGLU at SmolLM2's K = 576 from M = 1024 (H100 sweep 2026-12-06): 128 x 64 tiles, 4 warps, one program
    per tile (``KernelOptions(narrow_swiglu=False)`` switches it off); a wider K (Qwen2.5-1.5B's 1536) and q keep
    the persistent default."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    kernel, cfg = tm.default_mn_config(4096, 1536, 576, 128, True)
    assert kernel == "perm" and (cfg.block_m, cfg.block_n, cfg.num_warps, cfg.persistent) == (128, 64, 4, 0)
    assert tm.default_mn_config(4096, 8960, 1536, 128, True)[1].persistent == 1
    assert tm.default_mn_config(4096, 576, 576, 192, False)[1].num_warps == 8  # q: unchanged
    assert tm.default_mn_config(512, 1536, 576, 128, True)[1].block_n == 128  # below DENSE_MIN_M: unchanged
    assert tm.default_mn_config(4096, 1536, 576, 128, True, KernelOptions(narrow_swiglu=False))[1].persistent == 1


def test_kernel_options_apply_inside_their_block_and_parse_from_flags(monkeypatch):
    """`use_kernel_options` switches the defaults for a block (nested blocks stack), explicit options win, and
    ``--kernel-option`` items parse to the options or fail naming the flag."""
    from wide.kernels import kernel_options, use_kernel_options

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert kernel_options() == KernelOptions()
    with use_kernel_options(skinny_swap=False) as opts:
        assert opts.changed() == {"skinny_swap": False}
        assert not tm.default_mn_config(16, 4096, 4096, 512, False)[1].swap
        assert not tk.default_k_config(16, 4096, 14336, 128).swap
        with use_kernel_options(persistent_mn=False):
            assert kernel_options() == KernelOptions(skinny_swap=False, persistent_mn=False)
            assert not tm.default_mn_config(4096, 14336, 4096, 128, True)[1].persistent
        assert tm.default_mn_config(4096, 14336, 4096, 128, True)[1].persistent
        assert tm.default_mn_config(16, 4096, 4096, 512, False, KernelOptions())[1].swap
    assert kernel_options() == KernelOptions() and tm.default_mn_config(16, 4096, 4096, 512, False)[1].swap
    assert KernelOptions.parse(["skinny_swap=0", "decode_fold=true"]) == KernelOptions(skinny_swap=False)
    with pytest.raises(ValueError, match=r"--kernel-option: unknown kernel option 'skiny_swap'\. Did you mean "
                                         r"'skinny_swap'"):
        KernelOptions.parse(["skiny_swap=0"])
    with pytest.raises(ValueError, match="NAME=0 or NAME=1"):
        KernelOptions.parse(["skinny_swap=maybe"])


def test_prefill_attention_packs_a_units_heads_only_when_switched_on(monkeypatch):
    """``attn_pack`` changes only ``pack`` of the default prefill tiles (off by default: no gain measured), inside a
    `use_kernel_options` block too; the host then lays a token's heads in as many rows, no power-of-two padding."""
    import dataclasses

    import torch

    from wide.kernels import get_backend, make_plan, use_kernel_options
    from wide.kernels.triton import attention as ta

    monkeypatch.setattr(ta, "interpreting", lambda: False)
    for T, D in ((4096, 64), (16384, 64), (4096, 128), (16384, 128)):
        padded = ta.default_prefill_config(T, D)
        assert not padded.pack
        packed = ta.default_prefill_config(T, D, 2, KernelOptions(attn_pack=True))
        assert packed == dataclasses.replace(padded, pack=True)
        with use_kernel_options(attn_pack=True):
            assert ta.default_prefill_config(T, D).pack
    monkeypatch.undo()
    # the launch: 6 heads a unit take 6 rows a token packed (16 // 6 = 2 tokens a tile), 8 padded (2 tokens)
    launched = []
    real = ta.attention_prefill_routed
    monkeypatch.setattr(ta, "attention_prefill_routed",
                        lambda *a, **k: launched.append(a[-1] if len(a) > 10 else k.get("config")) or real(*a, **k))
    q, kv = torch.randn(1, 5, 12, 16), torch.randn(1, 5, 2, 16)
    mask = torch.rand(1, 5, 2) < 0.5
    ref = get_backend("torch").attention_prefill(q, kv, kv, mask)
    with use_kernel_options(attn_pack=True):
        out = get_backend("triton").attention_prefill(q, kv, kv, mask, plan=make_plan(mask))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert launched and launched[-1].pack
    with pytest.raises(ValueError, match="must hold one token's 6 heads"):
        ta.attention_prefill_routed(q, kv, kv, torch.empty_like(q), *make_plan(mask).token_order(flat=False), None, 6,
                                    True, 0.25, ta.AttentionConfig(block_m=4, block_n=16, pack=True))
