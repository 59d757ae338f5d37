"""`triton` and `gather` against the `torch` reference on many small random problems (CPU interpreter).

Every run writes into a NaN-filled `out=` buffer, so an element a kernel forgets to write fails.
Shapes are odd on purpose (M, T, S, N not multiples of any block); masks are all-false, all-true or
random; K/V are strided views of an HF-style ``[B, Hk, S, D]`` cache; decode rows are right-padded.
"""

from __future__ import annotations

import random

import pytest
import torch

from wide.kernels import get_backend, make_plan
from wide.kernels.backends.torch_ref import expand_groups

from .cases import INTERPRET, check, poisoned, random_mask

pytestmark = pytest.mark.skipif(not INTERPRET, reason="random cases run under the Triton CPU interpreter")

DTYPES = [torch.float16, torch.float32]
N_CASES = {"gemm_mn": 55, "swiglu": 30, "gemm_k": 55, "prefill": 45, "decode": 40}


def _density(rng: random.Random) -> float:
    return rng.choice([0.0, 1.0, 0.5, rng.uniform(0.05, 0.95)])


def _mn_config(rng: random.Random, M: int, group: int, N: int):
    from wide.kernels.triton.common import GemmConfig

    choice = rng.choice(["default", "direct", "perm", "dense"])
    if choice == "default":
        return None
    if choice == "dense":  # cuBLAS + masking epilogue (the high-density path)
        return "dense", None
    if choice == "direct":
        bm = 1 if M == 1 and rng.random() < 0.7 else rng.choice([16, 32])
        return "direct", GemmConfig(bm, 16, rng.choice([16, 32]), split_k=rng.choice([1, 1, 2, 3]),
                                    swap=bm > 1 and rng.random() < 0.5)
    return "perm", GemmConfig(rng.choice([16, 32]), 16, rng.choice([16, 32]), group_m=rng.choice([1, 2, 8]),
                              persistent=rng.choice([0, 1]))


def _gemm_problem(seed: int, swiglu: bool = False):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    dtype = rng.choice(DTYPES)
    group = rng.choice([16, 32, 48])
    ng = rng.randint(1, 4)
    N = group * ng
    K = rng.choice([16, 24, 40, 64, 72])
    if rng.random() < 0.3:
        lead = (rng.randint(1, 3), rng.randint(1, 13))
    else:
        lead = (rng.choice([1, 1, 2, 3, 5, 16, 17, 33, 40, 67]),)
    M = 1
    for s in lead:
        M *= s
    x = torch.randn(*lead, K, generator=gen).to(dtype)
    w = (torch.randn(N, K, generator=gen) / K**0.5).to(dtype)
    w2 = (torch.randn(N, K, generator=gen) / K**0.5).to(dtype)
    bias = torch.randn(N, generator=gen).to(dtype) if (not swiglu and rng.random() < 0.5) else None
    act = None if swiglu else rng.choice([None, "silu", "gelu", "relu"])
    mask = random_mask((*lead, ng), _density(rng), gen)
    return rng, dtype, x, w, w2, bias, act, mask, group, M


def _ids(kind):
    return [f"{kind}-{i}" for i in range(N_CASES[kind])]


@pytest.mark.parametrize("seed", range(N_CASES["gemm_mn"]), ids=_ids("gemm_mn"))
def test_gemm_mn(seed):
    rng, dtype, x, w, _, bias, act, mask, group, M = _gemm_problem(1000 + seed)
    ref = get_backend("torch").gemm_mn(x.float(), w.float(), mask, bias=None if bias is None else bias.float(),
                                       activation=act)
    zeros = ~expand_groups(mask, group)
    plan = make_plan(mask)
    out = poisoned(ref.shape, dtype, x.device)
    get_backend("triton").gemm_mn(x, w, mask, bias=bias, activation=act, plan=plan, out=out,
                                  config=_mn_config(rng, M, group, w.shape[0]))
    check(out, ref, dtype, zeros, "triton")
    out = poisoned(ref.shape, dtype, x.device)
    get_backend("gather").gemm_mn(x, w, mask, bias=bias, activation=act, plan=plan, out=out)
    check(out, ref, dtype, zeros, "gather")


@pytest.mark.parametrize("seed", range(N_CASES["swiglu"]), ids=_ids("swiglu"))
def test_swiglu(seed):
    rng, dtype, x, w, w2, _, _, mask, group, M = _gemm_problem(2000 + seed, swiglu=True)
    ref = get_backend("torch").swiglu(x.float(), w.float(), w2.float(), mask)
    zeros = ~expand_groups(mask, group)
    out = poisoned(ref.shape, dtype, x.device)
    get_backend("triton").swiglu(x, w, w2, mask, out=out, config=_mn_config(rng, M, group, w.shape[0]))
    check(out, ref, dtype, zeros, "triton")
    out = poisoned(ref.shape, dtype, x.device)
    get_backend("gather").swiglu(x, w, w2, mask, out=out)
    check(out, ref, dtype, zeros, "gather")


@pytest.mark.parametrize("seed", range(N_CASES["gemm_k"]), ids=_ids("gemm_k"))
def test_gemm_k(seed):
    from wide.kernels.triton.common import GemmConfig

    rng = random.Random(3000 + seed)
    gen = torch.Generator().manual_seed(3000 + seed)
    dtype = rng.choice(DTYPES)
    group = rng.choice([16, 32, 48])
    ng = rng.randint(1, 4)
    K = group * ng
    N = rng.choice([16, 20, 33, 48, 64])
    lead = (rng.randint(1, 3), rng.randint(1, 13)) if rng.random() < 0.3 else (rng.choice([1, 1, 2, 7, 16, 19, 40, 70]),)
    M = 1
    for s in lead:
        M *= s
    x = torch.randn(*lead, K, generator=gen).to(dtype)
    w = (torch.randn(N, K, generator=gen) / K**0.5).to(dtype)
    bias = torch.randn(N, generator=gen).to(dtype) if rng.random() < 0.5 else None
    mask = random_mask((*lead, ng), _density(rng), gen)
    if rng.random() < 0.3:  # structured: rows drawn from a few patterns (what the sorted variant is for)
        pats = random_mask((rng.randint(1, 3), ng), _density(rng), gen)
        mask = pats[torch.randint(0, pats.shape[0], lead, generator=gen)]
    config = None
    if rng.random() < 0.6:
        bm = 1 if (M == 1 and rng.random() < 0.7) else rng.choice([16, 32])
        variant = rng.choice(["", "list", "local", "premask", "sorted"])
        bk = 32 if (variant == "" and K % 32 == 0) else 16  # affine chunks may span several groups
        bm = 16 if (variant == "sorted" and bm == 1) else bm  # sorted tiles go through tl.dot
        # the transposed tile (swap) takes chunks inside one group, on the affine and list loops
        swap = bm > 1 and group % bk == 0 and variant in ("", "list", "local") and rng.random() < 0.5
        config = GemmConfig(bm, rng.choice([16, 32]), bk, split_k=rng.choice([1, 2, 3]), group_m=rng.choice([1, 4]),
                            variant=variant, swap=swap)
    x_masked = rng.random() < 0.3  # x as gemm_mn/swiglu leave it: zero in masked groups
    if x_masked:
        x = x * expand_groups(mask, group).to(dtype)
    if rng.random() < 0.35:  # stored column-major (`wide.set_weight_layout`): the same values, strides (1, N)
        w = w.t().contiguous().t()
    ref = get_backend("torch").gemm_k(x.float(), w.float(), mask, bias=None if bias is None else bias.float())
    out = poisoned(ref.shape, dtype, x.device)
    get_backend("triton").gemm_k(x, w, mask, bias=bias, out=out, config=config, x_masked=x_masked)
    check(out, ref, dtype, None, "triton")
    out = poisoned(ref.shape, dtype, x.device)
    get_backend("gather").gemm_k(x, w, mask, bias=bias, out=out)
    check(out, ref, dtype, None, "gather")


def _heads(rng: random.Random):
    """(Hq, Hk, group size): GQA ratios 1-8 (3, 6, 7: SmolLM2, Qwen2.5-1.5B / 0.5B), groups from one head to
    several kv heads' worth."""
    HK = rng.choice([1, 2])
    qpk = rng.choice([1, 2, 3, 4, 6, 7, 8])
    HQ = HK * qpk
    sizes = [d for d in range(1, HQ + 1) if HQ % d == 0 and (qpk % d == 0 or d % qpk == 0)]
    return HQ, HK, rng.choice(sizes)


def _kv(B, S, HK, D, dtype, gen, strided: bool):
    if strided:  # an HF cache is [B, Hk, S, D]; the kernels take its transpose with no copy
        k = torch.randn(B, HK, S, D, generator=gen).to(dtype).transpose(1, 2)
        v = torch.randn(B, HK, S, D, generator=gen).to(dtype).transpose(1, 2)
    else:
        k = torch.randn(B, S, HK, D, generator=gen).to(dtype)
        v = torch.randn(B, S, HK, D, generator=gen).to(dtype)
    return k, v


@pytest.mark.parametrize("seed", range(N_CASES["prefill"]), ids=_ids("prefill"))
def test_attention_prefill(seed):
    from wide.kernels.triton.attention import AttentionConfig

    rng = random.Random(4000 + seed)
    gen = torch.Generator().manual_seed(4000 + seed)
    dtype = rng.choice(DTYPES)
    B = rng.randint(1, 2)
    T = rng.choice([1, 3, 9, 16, 21])
    causal = rng.random() < 0.75
    S = T + rng.choice([0, 0, 5, 11]) if causal else rng.choice([1, 7, 19, 30])
    HQ, HK, gsize = _heads(rng)
    D = rng.choice([16, 32, 32, 64])
    q = torch.randn(B, T, HQ, D, generator=gen).to(dtype)
    k, v = _kv(B, S, HK, D, dtype, gen, strided=rng.random() < 0.6)
    mask = random_mask((B, T, HQ // gsize), _density(rng), gen)
    lengths = q_offset = None
    if rng.random() < 0.3:
        lengths = torch.tensor([rng.randint(1, S) for _ in range(B)], dtype=torch.int32)
    if causal and rng.random() < 0.3:  # a prompt chunk over a longer cache: its queries start at a row's offset
        q_offset = torch.tensor([rng.randint(0, S - T) for _ in range(B)], dtype=rng.choice([torch.int32, torch.int64]))
        if rng.random() < 0.7:
            lengths = (q_offset + T).to(torch.int32)  # the cache holds the chunk's keys and nothing later
    config = None
    if rng.random() < 0.5:
        hu_p = 1 << (min(gsize, HQ // HK) - 1).bit_length()  # heads per unit, padded to a power of two
        config = AttentionConfig(block_m=max(16, hu_p) * rng.choice([1, 2]), block_n=rng.choice([16, 32]),
                                 pack=rng.random() < 0.5)  # packed: a unit's heads unpadded, BLOCK_M // HU tokens
    ref = get_backend("torch").attention_prefill(q.float(), k.float(), v.float(), mask, causal=causal,
                                                 lengths=lengths, q_offset=q_offset)
    zeros = ~expand_groups(mask, gsize)
    plan = make_plan(mask)
    out = poisoned(q.shape, dtype, q.device)
    get_backend("triton").attention_prefill(q, k, v, mask, causal=causal, lengths=lengths, q_offset=q_offset, plan=plan,
                                            out=out, config=config)
    check(out, ref, dtype, zeros, "triton")
    out = poisoned(q.shape, dtype, q.device)
    get_backend("gather").attention_prefill(q, k, v, mask, causal=causal, lengths=lengths, q_offset=q_offset,
                                            plan=plan, out=out)
    check(out, ref, dtype, zeros, "gather")


@pytest.mark.parametrize("seed", range(N_CASES["decode"]), ids=_ids("decode"))
def test_attention_decode(seed):
    from wide.kernels.triton.attention import AttentionConfig

    rng = random.Random(5000 + seed)
    gen = torch.Generator().manual_seed(5000 + seed)
    dtype = rng.choice(DTYPES)
    B = rng.randint(1, 3)
    S = rng.choice([1, 5, 16, 33, 47])
    HQ, HK, gsize = _heads(rng)
    D = rng.choice([16, 32, 64])
    q = torch.randn(B, 1, HQ, D, generator=gen).to(dtype)
    k, v = _kv(B, S, HK, D, dtype, gen, strided=rng.random() < 0.7)
    mask = random_mask((B, 1, HQ // gsize), _density(rng), gen)
    lengths = None
    if rng.random() < 0.6:  # right-padded batch; a zero-length row gives zeros
        lengths = torch.tensor([rng.randint(0 if rng.random() < 0.1 else 1, S) for _ in range(B)])
    config = AttentionConfig(block_n=16, num_stages=1, splits=rng.choice([0, 1, 2, 3, 5]), fold=rng.random() < 0.5)
    ref = get_backend("torch").attention_decode(q.float(), k.float(), v.float(), mask, lengths=lengths)
    zeros = ~expand_groups(mask, gsize)
    out = poisoned(q.shape, dtype, q.device)
    get_backend("triton").attention_decode(q, k, v, mask, lengths=lengths, out=out, config=config)
    check(out, ref, dtype, zeros, "triton")
    out = poisoned(q.shape, dtype, q.device)
    get_backend("gather").attention_decode(q, k, v, mask, lengths=lengths, out=out)
    check(out, ref, dtype, zeros, "gather")


@pytest.mark.parametrize("M", [1, 5, 16])
@pytest.mark.parametrize("fill", ["none", "all", "random"])
@pytest.mark.parametrize("swiglu", [False, True])
@pytest.mark.parametrize("split", [2, 3])
def test_direct_split_k_matches_reference(M, fill, swiglu, split):
    """The direct small-M kernel with K split over programs (the last to arrive sums the partials, then the
    bias / activation / SwiGLU epilogue) equals the reference, tiles no row needs included."""
    from wide.kernels.triton.common import GemmConfig

    gen = torch.Generator().manual_seed(M * 100 + split * 10 + swiglu)
    ng, group, K = 4, 16, 80  # 5 chunks of 16: uneven shares per split
    x = torch.randn(M, K, generator=gen)
    w, w2 = torch.randn(ng * group, K, generator=gen) / K**0.5, torch.randn(ng * group, K, generator=gen) / K**0.5
    bias = None if swiglu else torch.randn(ng * group, generator=gen)
    mask = {"none": torch.zeros(M, ng, dtype=torch.bool), "all": torch.ones(M, ng, dtype=torch.bool),
            "random": random_mask((M, ng), 0.5, gen)}[fill]
    cfg = ("direct", GemmConfig(1 if M == 1 else 16, 16, 16, split_k=split))
    tb, ref = get_backend("triton"), get_backend("torch")
    out = poisoned((M, ng * group), x.dtype, x.device)
    if swiglu:
        tb.swiglu(x, w, w2, mask, out=out, config=cfg)
        expect = ref.swiglu(x, w, w2, mask)
    else:
        tb.gemm_mn(x, w, mask, bias=bias, activation="gelu", out=out, config=cfg)
        expect = ref.gemm_mn(x, w, mask, bias=bias, activation="gelu")
    check(out, expect, x.dtype, None, "triton")


@pytest.mark.parametrize("M", [2, 17])
@pytest.mark.parametrize("fill", ["none", "all", "random", "coherent"])
@pytest.mark.parametrize("op", ["gemm_mn", "swiglu", "gemm_k", "gemm_k_list"])
@pytest.mark.parametrize("split", [1, 3])
def test_swapped_tiles_match_reference(M, fill, op, split):
    """``swap=True`` (the transposed skinny tile: weights on the MMA's M side) equals the reference: odd M,
    uneven K splits, masks all off, all on, random and the same for every row (batch-coherent decode)."""
    from wide.kernels.triton.common import GemmConfig

    gen = torch.Generator().manual_seed(M * 1000 + split * 10 + len(fill) + len(op))
    ng, group, K = 5, 16, 80
    mn = op in ("gemm_mn", "swiglu")
    n_in = K if mn else ng * group
    n_out = ng * group if mn else 48
    x = torch.randn(M, n_in, generator=gen)
    w, w2 = (torch.randn(n_out, n_in, generator=gen) / n_in**0.5 for _ in range(2))
    bias = torch.randn(n_out, generator=gen) if op in ("gemm_mn", "gemm_k") else None
    mask = {"none": torch.zeros(M, ng, dtype=torch.bool), "all": torch.ones(M, ng, dtype=torch.bool),
            "random": random_mask((M, ng), 0.5, gen),
            "coherent": random_mask((1, ng), 0.5, gen).expand(M, ng).contiguous()}[fill]
    tb, ref = get_backend("triton"), get_backend("torch")
    out = poisoned((M, n_out), x.dtype, x.device)
    if mn:
        cfg = ("direct", GemmConfig(16, 16, 16, split_k=split, swap=True))
        if op == "swiglu":
            tb.swiglu(x, w, w2, mask, out=out, config=cfg)
            expect = ref.swiglu(x, w, w2, mask)
        else:
            tb.gemm_mn(x, w, mask, bias=bias, activation="silu", out=out, config=cfg)
            expect = ref.gemm_mn(x, w, mask, bias=bias, activation="silu")
        zeros = ~expand_groups(mask, group)
    else:
        cfg = GemmConfig(16, 16, 16, split_k=split, swap=True, variant="list" if op == "gemm_k_list" else "")
        tb.gemm_k(x, w, mask, bias=bias, out=out, config=cfg)
        expect, zeros = ref.gemm_k(x, w, mask, bias=bias), None
    check(out, expect, x.dtype, zeros, "triton")


@pytest.mark.parametrize("M", [5, 37, 70])
@pytest.mark.parametrize("fill", ["none", "all", "random", "one group off", "one group on"])
@pytest.mark.parametrize("op", ["gemm_mn", "swiglu"])
@pytest.mark.parametrize("block", [(16, 16, 16), (16, 32, 32), (32, 16, 16)], ids=str)
def test_persistent_tiles_match_reference_and_the_per_tile_kernel(M, fill, op, block):
    """The persistent large-M kernel (``GemmConfig.persistent``: 3 programs in the interpreter, each striding over
    the active tiles, then the zero tiles) equals the reference and, bit for bit, the one-program-per-tile kernel:
    odd M, ragged K, groups of two N tiles, groups with no / every token active."""
    from wide.kernels.triton.common import GemmConfig

    gen = torch.Generator().manual_seed(M * 100 + len(fill) + len(op) + block[0] + block[1])
    ng, group, K = 3, 32, 40
    N = ng * group
    x = torch.randn(M, K, generator=gen)
    w, w2 = (torch.randn(N, K, generator=gen) / K**0.5 for _ in range(2))
    mask = {"none": torch.zeros(M, ng, dtype=torch.bool), "all": torch.ones(M, ng, dtype=torch.bool),
            "random": random_mask((M, ng), 0.5, gen)}.get(fill)
    if mask is None:  # one group's column differs from the random rest
        mask = random_mask((M, ng), 0.5, gen)
        mask[:, 1] = fill == "one group on"
    tb, ref = get_backend("triton"), get_backend("torch")
    outs = []
    for persistent in (1, 0):
        cfg = ("perm", GemmConfig(*block, persistent=persistent))
        out = poisoned((M, N), x.dtype, x.device)
        if op == "swiglu":
            tb.swiglu(x, w, w2, mask, out=out, config=cfg)
            expect = ref.swiglu(x, w, w2, mask)
        else:
            bias = torch.randn(N, generator=torch.Generator().manual_seed(1))
            tb.gemm_mn(x, w, mask, bias=bias, activation="gelu", out=out, config=cfg)
            expect = ref.gemm_mn(x, w, mask, bias=bias, activation="gelu")
        check(out, expect, x.dtype, ~expand_groups(mask, group), "triton")
        outs.append(out)
    assert torch.equal(outs[0], outs[1])


def test_swap_refuses_the_gemv_and_chunks_across_groups():
    from wide.kernels.triton.common import GemmConfig

    x, w = torch.randn(1, 64), torch.randn(32, 64)
    mask = torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="swap=True needs block_m > 1"):
        get_backend("triton").gemm_mn(x, w, mask, config=("direct", GemmConfig(1, 16, 16, swap=True)))
    with pytest.raises(ValueError, match="block_k=32 dividing the group size 16"):
        get_backend("triton").gemm_k(torch.randn(2, 32), torch.randn(8, 32), torch.ones(2, 2, dtype=torch.bool),
                                     config=GemmConfig(16, 16, 32, swap=True))


@pytest.mark.parametrize("fill", ["none", "all", "random"])
@pytest.mark.parametrize("splits", [1, 3, 4])
@pytest.mark.parametrize("gsize", [1, 2, 4])
def test_decode_splits_folded_into_the_last_program(fill, splits, gsize):
    """``fold=True``: each (row, KV head)'s last split program combines the splits (and split 0 writes the zeros
    of heads no split computes) — equal to the reference with padded rows, an empty row and uneven splits, and
    again on a second call (the arrival counters reset themselves)."""
    from wide.kernels.triton.attention import AttentionConfig

    gen = torch.Generator().manual_seed(splits * 10 + gsize + len(fill))
    B, S, HQ, HK, D = 4, 45, 8, 2, 32
    q = torch.randn(B, 1, HQ, D, generator=gen)
    k, v = _kv(B, S, HK, D, torch.float32, gen, strided=True)
    mask = {"none": torch.zeros(B, 1, HQ // gsize, dtype=torch.bool),
            "all": torch.ones(B, 1, HQ // gsize, dtype=torch.bool),
            "random": random_mask((B, 1, HQ // gsize), 0.5, gen)}[fill]
    lengths = torch.tensor([S, 17, 0, 1])
    ref = get_backend("torch").attention_decode(q, k, v, mask, lengths=lengths)
    cfg = AttentionConfig(block_n=16, num_stages=1, splits=splits, fold=True)
    for _ in range(2):
        out = poisoned(q.shape, q.dtype, q.device)
        get_backend("triton").attention_decode(q, k, v, mask, lengths=lengths, out=out, config=cfg)
        check(out, ref, q.dtype, ~expand_groups(mask, gsize), "triton")


@pytest.mark.parametrize("config", [(2, 32, 4), (4, 32, 8, 2), (1, 64, 4, 5), (3, 32, 4, 4)])
@pytest.mark.parametrize("B", [1, 3])
def test_decode_qkv_sweep_configs_match_reference(config, B):
    """`benchmarks/decode_qkv_sweep.py`'s configs, incl. a pipeline depth (4th element), give the reference's q, cache
    writes and position (a 50% mask, bias, an odd K)."""
    from wide.kernels import decode_qkv
    from wide.kernels.triton.decode_qkv import decode_qkv as host

    gen = torch.Generator().manual_seed(B * 100 + config[0] * 10 + config[1])
    K, HQ, HK, D, S, pos = 100, 6, 2, 32, 7, 3
    x = torch.randn(B, 1, K, generator=gen)
    ws = [torch.randn(h * D, K, generator=gen) * K ** -0.5 for h in (HQ, HK, HK)]
    bs = [torch.randn(h * D, generator=gen) * 0.1 for h in (HQ, HK, HK)]
    angle = torch.rand(1, 1, D, generator=gen) * 6.28
    cos, sin = angle.cos(), angle.sin()
    mask = random_mask((B, 1, 3), 0.5, gen)
    cache = torch.randn(2, B, HK, S, D, generator=gen)
    kr, vr, at_r = cache[0].clone(), cache[1].clone(), torch.tensor(pos)
    ref = decode_qkv(x, *ws, mask, q_bias=bs[0], k_bias=bs[1], v_bias=bs[2], cos=cos, sin=sin, k_cache=kr,
                     v_cache=vr, position=at_r, backend="torch")
    kt, vt, at_t = cache[0].clone(), cache[1].clone(), torch.tensor(pos)
    out = host(x, *ws, mask, *bs, cos, sin, kt, vt, at_t, config=config)
    check(out, ref, torch.float32, None, f"q {config}")
    check(kt, kr, torch.float32, None, f"k cache {config}")
    check(vt, vr, torch.float32, None, f"v cache {config}")
    assert at_t.item() == at_r.item() == pos + 1
