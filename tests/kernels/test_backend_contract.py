"""The contract of every registered kernel backend, for every routed op: forced by name through the public ops
of `wide.kernels`, a call gives the ``torch`` reference's result (on fp32 copies of its inputs) on odd shapes
(sizes off the tiles, one row, no rows), random / all-off / all-on masks and masks with rows that run nothing,
in fp32 and fp16 (bf16 on a GPU only: the Triton interpreter's bf16 ``tl.dot`` is wrong on CPU). A backend
may decline a call, but only with a reason (then the reference runs); one that implements an op must run some
of its cases itself. A backend that is not available here is listed with ``-unavailable-here`` in its id: its
calls must fall back to the reference, same results."""

from __future__ import annotations

import itertools

import pytest
import torch

import wide.kernels as wk
from wide.kernels import dispatch, get_backend, list_backends
from wide.kernels.backends import OPS, REFERENCE
from wide.kernels.backends.torch_ref import expand_groups

from .cases import TOL, check

DEV = "cuda" if torch.cuda.is_available() else "cpu"
BACKENDS = [pytest.param(n, id=n if get_backend(n).is_available() else f"{n}-unavailable-here")
            for n in list_backends()]
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.float16, id="fp16"),
          pytest.param(torch.bfloat16, id="bf16", marks=[pytest.mark.gpu, pytest.mark.skipif(
              not torch.cuda.is_available(), reason="bf16 numerics need the GPU")])]
MASKS = ("random", "off", "on", "rows-off")


def _mask(shape, kind: str, gen: torch.Generator) -> torch.Tensor:
    m = torch.rand(shape, generator=gen) < 0.5
    if kind == "off":
        m = torch.zeros(shape, dtype=torch.bool)
    elif kind == "on":
        m = torch.ones(shape, dtype=torch.bool)
    elif kind == "rows-off":  # every third row (token) runs no group
        m.view(-1, shape[-1])[::3] = False
    return m.to(DEV)


def _randn(gen, *shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, generator=gen) * scale).to(DEV, dtype)


def _f32(t):
    return None if t is None else t.float()


# ---- cases: each yields (label, call(backend) -> output, compare(out, ref)) --------------------------------


def _cmp(dtype, zeros=None):
    def compare(out, ref, what):
        assert out.shape == ref.shape and out.dtype == dtype, f"{what}: {out.dtype} {tuple(out.shape)}"
        if ref.numel():  # no rows: the shape is the whole answer
            check(out.float(), ref, dtype, zeros, what)
    return compare


def _gemm_mn_cases(dtype, gen, swiglu=False):
    K, N, ng = 40, 64, 4  # K off the 16-wide chunks; groups of 16
    for lead, kind in itertools.product([(2, 19), (5,), (1,), (0,)], MASKS):
        x = _randn(gen, *lead, K, dtype=dtype)
        w, w2, b = _randn(gen, N, K, dtype=dtype, scale=0.2), _randn(gen, N, K, dtype=dtype, scale=0.2), \
            _randn(gen, N, dtype=dtype)
        mask = _mask((*lead, ng), kind, gen)
        zeros = ~expand_groups(mask, N // ng)
        if swiglu:
            yield (f"{lead} {kind}", lambda be, x=x, w=w, w2=w2, m=mask: wk.swiglu(x, w, w2, m, backend=be),
                   lambda x=x, w=w, w2=w2, m=mask: wk.swiglu(x.float(), w.float(), w2.float(), m, backend=REFERENCE),
                   _cmp(dtype, zeros))
        else:
            act = "silu" if kind in ("random", "rows-off") else None
            yield (f"{lead} {kind} act={act}",
                   lambda be, x=x, w=w, b=b, m=mask, a=act: wk.gemm_mn(x, w, m, bias=b, activation=a, backend=be),
                   lambda x=x, w=w, b=b, m=mask, a=act: wk.gemm_mn(x.float(), w.float(), m, bias=b.float(),
                                                                  activation=a, backend=REFERENCE),
                   _cmp(dtype, zeros))


def _gemm_k_cases(dtype, gen):
    K, N, ng = 64, 24, 4  # N off the tiles
    for (lead, kind), x_masked in zip(itertools.product([(2, 19), (5,), (1,), (0,)], MASKS), itertools.cycle(
            [False, True, False])):
        mask = _mask((*lead, ng), kind, gen)
        x = _randn(gen, *lead, K, dtype=dtype)
        if x_masked:  # the promise: x is zero in the masked groups (gemm_mn's output under the same mask)
            x = x * expand_groups(mask, K // ng).to(dtype)
        w, b = _randn(gen, N, K, dtype=dtype, scale=0.2), _randn(gen, N, dtype=dtype) if kind != "on" else None
        # a residual stream added in the epilogue (a decode step's o_proj / down_proj with the layer's add)
        r = _randn(gen, *lead, N, dtype=dtype) if kind in ("random", "off") else None
        yield (f"{lead} {kind} x_masked={x_masked} residual={r is not None}",
               lambda be, x=x, w=w, b=b, m=mask, xm=x_masked, r=r: wk.gemm_k(x, w, m, bias=b, x_masked=xm,
                                                                             residual=r, backend=be),
               lambda x=x, w=w, b=b, m=mask, r=r: wk.gemm_k(x.float(), w.float(), m, bias=_f32(b), residual=_f32(r),
                                                            backend=REFERENCE),
               _cmp(dtype))


def _ffn_experts_cases(dtype, gen):
    K, F, N, ng = 40, 64, 24, 4  # K and N off the tiles; groups of 16
    for lead, kind in itertools.product([(2, 19), (5,), (1,), (0,)], MASKS):
        x = _randn(gen, *lead, K, dtype=dtype)
        g, u, d = (_randn(gen, *s, dtype=dtype, scale=0.2) for s in ((F, K), (F, K), (N, F)))
        mask = _mask((*lead, ng), kind, gen)
        yield (f"{lead} {kind}", lambda be, x=x, g=g, u=u, d=d, m=mask: wk.ffn_experts(x, g, u, d, m, backend=be),
               lambda x=x, g=g, u=u, d=d, m=mask: wk.ffn_experts(x.float(), g.float(), u.float(), d.float(), m,
                                                                backend=REFERENCE),
               _cmp(dtype))


def _attention_prefill_cases(dtype, gen):
    B, HQ, HK, D, ng = 2, 4, 2, 16, 2
    shapes = [  # (T, S, causal, lengths, q_offset)
        (11, 11, True, None, None), (1, 1, True, None, None),
        (11, 14, False, [14, 9], None), (5, 12, True, [12, 9], [7, 4]),
    ]
    for (T, S, causal, lens, offs), kind in itertools.product(shapes, MASKS):
        q = _randn(gen, B, T, HQ, D, dtype=dtype)
        k = _randn(gen, B, HK, S, D, dtype=dtype).transpose(1, 2)  # an HF cache's layout
        v = _randn(gen, B, S, HK, D, dtype=dtype)
        lens = torch.tensor(lens, device=DEV) if lens else None
        offs = torch.tensor(offs, device=DEV) if offs else None
        mask = _mask((B, T, ng), kind, gen)
        zeros = ~expand_groups(mask, HQ // ng)[..., None].expand(B, T, HQ, D)
        kw = dict(causal=causal, lengths=lens, q_offset=offs)
        yield (f"T={T} S={S} causal={causal} lengths={lens is not None} q_offset={offs is not None} {kind}",
               lambda be, q=q, k=k, v=v, m=mask, kw=kw: wk.attention_prefill(q, k, v, m, backend=be, **kw),
               lambda q=q, k=k, v=v, m=mask, kw=kw: wk.attention_prefill(q.float(), k.float(), v.float(), m,
                                                                        backend=REFERENCE, **kw),
               _cmp(dtype, zeros))


def _attention_decode_cases(dtype, gen):
    HQ, HK, D, ng, S = 4, 2, 16, 2, 13
    for B, kind in itertools.product([3, 1], MASKS):
        q = _randn(gen, B, 1, HQ, D, dtype=dtype)
        k = _randn(gen, B, HK, S, D, dtype=dtype).transpose(1, 2)
        v = _randn(gen, B, HK, S, D, dtype=dtype).transpose(1, 2)
        lens = torch.randint(1, S + 1, (B,), generator=gen).to(DEV)
        mask = _mask((B, 1, ng), kind, gen)
        zeros = ~expand_groups(mask, HQ // ng)[..., None].expand(B, 1, HQ, D)
        yield (f"B={B} {kind}", lambda be, q=q, k=k, v=v, m=mask, n=lens: wk.attention_decode(q, k, v, m, lengths=n,
                                                                                              backend=be),
               lambda q=q, k=k, v=v, m=mask, n=lens: wk.attention_decode(q.float(), k.float(), v.float(), m, lengths=n,
                                                                         backend=REFERENCE),
               _cmp(dtype, zeros))


def _router(gen, lowrank: bool, D: int = 40):
    """fp32 weights (how `apply_wide` keeps a router's): low-rank (rank 8, 5 groups) or linear (9 groups)."""
    down = _randn(gen, 8 if lowrank else 9, D, scale=D ** -0.5)
    up = _randn(gen, 5, 8, scale=0.35) if lowrank else None
    return down, up, _randn(gen, up.shape[0] if lowrank else 9, scale=0.1)


def _router_margin_cases(dtype, gen):
    tol = TOL[dtype] * 10

    def compare(out, ref, what):  # margins within tolerance; decisions equal where the margin is clear
        margin, decided = out
        torch.testing.assert_close(margin, ref, rtol=tol, atol=tol * ref.abs().max().item(), msg=what)
        clear = ref.abs() > 10 * tol * ref.abs().max()
        assert decided.dtype == torch.bool and torch.equal(decided[clear], (ref >= 0)[clear]), what

    for lead, lowrank in itertools.product([(2, 3), (70,), (1,)], [True, False]):  # 70 rows: past the decode kernel
        x = _randn(gen, *lead, 40, dtype=dtype, scale=2.0)
        down, up, bias = _router(gen, lowrank)

        def call(be, x=x, down=down, up=up, bias=bias):
            return (wk.router_margin(x, down, up, bias, decide=False, backend=be),
                    wk.router_margin(x, down, up, bias, backend=be))

        yield (f"{lead} lowrank={lowrank}", call,
               lambda x=x, down=down, up=up, bias=bias: wk.router_margin(x.float(), down, up, bias, decide=False,
                                                                        backend=REFERENCE), compare)


def _rms_norm_route_cases(dtype, gen):
    ulp = torch.finfo(dtype).eps
    rtol = 2 * ulp if dtype != torch.float32 else 1e-5  # fp32: the sums' order and rsqrt differ a few ulp

    def compare(out, ref, what):  # y within ~1 ulp; decisions equal except at near-ties of the reference margin
        (y, decided), (y0, margin) = out, ref
        assert y.dtype == y0.dtype and y.shape == y0.shape, what
        torch.testing.assert_close(y.float(), y0.float(), rtol=rtol, atol=1e-6, msg=what)
        assert decided.dtype == torch.bool and decided.shape == margin.shape, what
        clear = margin.abs() >= 1e-3
        assert torch.equal(decided[clear], (margin >= 0)[clear]), what

    for D, M, (has_up, has_bias) in itertools.product((72, 200), (1, 3, 16, 70),
                                                      itertools.product((True, False), repeat=2)):
        if M == 70 and (D, has_up, has_bias) != (72, True, True):  # past the decode kernel: once
            continue
        x = _randn(gen, M, D, dtype=dtype, scale=2.0).view(M, 1, D)
        w = (1.0 + 0.3 * torch.randn(D, generator=gen)).to(DEV, torch.float32 if M == 3 else dtype)
        down = _randn(gen, 8 if has_up else 9, D, scale=D ** -0.5)
        up = _randn(gen, 5, 8, scale=0.35) if has_up else None
        bias = _randn(gen, 5 if has_up else 9, scale=0.1) if has_bias else None

        def call(be, x=x, w=w, r=(down, up, bias)):
            return wk.rms_norm_route(x, w, 1e-5, *r, backend=be)

        def reference(x=x, w=w, r=(down, up, bias)):
            return (wk.rms_norm_route(x, w, 1e-5, *r, backend=REFERENCE)[0],
                    wk.router_margin(x.float(), *r, decide=False, backend=REFERENCE))

        yield f"D={D} M={M} up={has_up} bias={has_bias}", call, reference, compare


def _gemm_k_route_cases(dtype, gen):
    ulp = torch.finfo(dtype).eps

    def compare(out, ref, what):  # h and y within tolerance; decisions equal except at near-ties of the margin
        (h, y, decided), (h0, y0, margin) = out, ref
        assert h.dtype == dtype and y.dtype == dtype and h.shape == h0.shape and y.shape == y0.shape, what
        if not h0.numel():  # no rows: the shapes are the whole answer
            return
        check(h.float(), h0, dtype, None, what + " h")
        check(y.float(), y0, dtype, None, what + " y")
        assert decided.dtype == torch.bool and decided.shape == margin.shape, what
        clear = margin.abs() >= max(1e-3, 40 * ulp * margin.abs().max().item())
        assert torch.equal(decided[clear], (margin >= 0)[clear]), what

    shapes = [  # (lead, K, groups, N, router rank or None: linear), N off the tiles
        ((1,), 64, 4, 40, 8), ((1, 1), 96, 3, 72, None), ((1, 1), 64, 4, 200, 16), ((3,), 64, 4, 40, 8), ((0,), 64, 4,
                                                                                                        40, 8)]
    for (lead, K, ng, N, rank), kind in itertools.product(shapes, MASKS):
        if len(lead) == 1 and lead[0] != 1 and kind not in ("random", "on"):
            continue
        mask = _mask((*lead, ng), kind, gen)
        x = _randn(gen, *lead, K, dtype=dtype)
        w = _randn(gen, N, K, dtype=dtype, scale=0.2)
        res = _randn(gen, *lead, N, dtype=dtype)
        nw = (1.0 + 0.3 * torch.randn(N, generator=gen)).to(DEV, dtype)
        down = _randn(gen, rank or 9, N, scale=N ** -0.5)
        up = _randn(gen, 5, rank, scale=0.35) if rank else None
        bias = _randn(gen, 5 if rank else 9, scale=0.1) if kind != "on" else None
        r = (down, up, bias)

        def call(be, x=x, w=w, m=mask, res=res, nw=nw, r=r):
            return wk.gemm_k_route(x, w, m, res, nw, 1e-5, *r, backend=be)

        def reference(x=x, w=w, m=mask, res=res, nw=nw, r=r):
            h, y, _ = wk.gemm_k_route(x.float(), w.float(), m, res.float(), nw.float(), 1e-5, *r, backend=REFERENCE)
            return h, y, wk.router_margin(h, *r, decide=False, backend=REFERENCE)

        yield f"{lead} K={K} G={ng} N={N} rank={rank} {kind} bias={bias is not None}", call, reference, compare


def _state(g):
    return (torch.zeros(g, device=DEV), torch.zeros(g, dtype=torch.bool, device=DEV),
            torch.zeros((), dtype=torch.int64, device=DEV),
            (torch.full((g,), -1, dtype=torch.int32, device=DEV), torch.full((1,), -1, dtype=torch.int32, device=DEV)))


def _steps(op_call, steps, g):
    """Two decode steps from a fresh state: the (ema, selection, step, group list) after each."""
    ema, sel, step, groups = _state(g)
    out = []
    for s in steps:
        op_call(s, ema, sel, step, groups)
        out.append((ema.clone(), sel.clone(), step.clone(), groups[0].clone(), groups[1].clone()))
    return out


def _compare_state(out, ref, what):
    for (e, s, n, o, c), (e0, s0, n0, o0, c0) in zip(out, ref):
        torch.testing.assert_close(e, e0, rtol=1e-4, atol=1e-5, msg=what)
        assert torch.equal(s, s0) and torch.equal(n, n0) and torch.equal(o, o0) and torch.equal(c, c0), what


def _coherent_select_cases(dtype, gen):
    for (B, G), keep in itertools.product([(3, 6), (1, 17)], [None, 2]):
        margins = [_randn(gen, B, G, dtype=dtype, scale=2.0) for _ in range(2)]
        kw = dict(keep=keep, memory=0.5, refresh_every=1)

        def call(be, margins=margins, kw=kw, G=G):
            return _steps(lambda m, e, s, n, grp: wk.coherent_select(m, e, s, n, groups=grp, backend=be, **kw),
                          margins, G)

        yield (f"B={B} G={G} keep={keep}", call,
               lambda margins=margins, kw=kw, G=G: _steps(lambda m, e, s, n, grp: wk.coherent_select(
                   m.float(), e, s, n, groups=grp, backend=REFERENCE, **kw), margins, G), _compare_state)


def _coherent_route_cases(dtype, gen):
    for B, lowrank, keep in ((3, True, None), (1, True, 2), (4, False, None)):
        down, up, bias = _router(gen, lowrank)
        xs = [_randn(gen, B, 1, 40, dtype=dtype, scale=2.0) for _ in range(2)]
        G = bias.shape[0]
        kw = dict(keep=keep, memory=0.5, refresh_every=2)

        def call(be, xs=xs, r=(down, up, bias), kw=kw, G=G):
            return _steps(lambda x, e, s, n, grp: wk.coherent_route(x, *r, ema=e, selection=s, step=n, groups=grp,
                                                                    backend=be, **kw), xs, G)

        yield (f"B={B} lowrank={lowrank} keep={keep}", call,
               lambda xs=xs, r=(down, up, bias), kw=kw, G=G: _steps(lambda x, e, s, n, grp: wk.coherent_route(
                   x.float(), *r, ema=e, selection=s, step=n, groups=grp, backend=REFERENCE, **kw), xs, G),
               _compare_state)


def _decode_qkv_cases(dtype, gen):
    """q / k / v + RoPE + a static-cache write: the returned q (zeros in skipped groups), both caches after the
    call (the new position written, every other untouched) and the position moved on by one."""
    def compare(out, ref, what):
        for got, want, name in zip(out, ref, ("q", "k_cache", "v_cache")):
            assert got.shape == want.shape and got.dtype == want.dtype, f"{what} {name}"
            check(got.float(), want.float(), dtype, None, f"{what} {name}")
        # whole heads of zeros: the skipped groups (a single element may also cancel to zero in 16 bits)
        assert torch.equal((out[0] == 0).all(-1), (ref[0] == 0).all(-1)), f"{what}: q's zero heads differ"
        assert out[3].item() == ref[3].item(), f"{what}: position {out[3].item()} != {ref[3].item()}"

    shapes = [  # (B, K, Hq, Hk, D, groups, bias, cos rows, position, cache length)
        (1, 72, 4, 2, 32, 2, True, 1, 5, 9), (3, 100, 6, 2, 64, 3, False, 1, 0, 4), (5, 40, 4, 4, 32, 4, True, 5, 3, 4),
        (2, 130, 8, 2, 32, 1, True, 2, 6, 7)]
    for (B, K, HQ, HK, D, G, bias, crows, pos, S), kind in itertools.product(shapes, (*MASKS[:3], "none")):
        x = _randn(gen, B, 1, K, dtype=dtype)
        ws = [_randn(gen, h * D, K, dtype=dtype, scale=K ** -0.5) for h in (HQ, HK, HK)]
        bs = [_randn(gen, h * D, dtype=dtype, scale=0.1) if bias else None for h in (HQ, HK, HK)]
        angle = torch.rand(crows, 1, D, generator=gen) * 6.28
        cos, sin = angle.cos().to(DEV, dtype), angle.sin().to(DEV, dtype)
        mask = _mask((B, 1, G), kind, gen) if kind != "none" else None  # None: every q head
        cache = _randn(gen, 2, B, HK, S, D, dtype=dtype)
        eager = kind in ("random", "none")  # RoPE rounded per product (eager transformers), else once

        def call(be, x=x, ws=ws, bs=bs, cos=cos, sin=sin, mask=mask, cache=cache, pos=pos, eager=eager):
            k, v = cache[0].clone(), cache[1].clone()
            at = torch.tensor(pos, device=DEV)
            q = wk.decode_qkv(x, *ws, mask, q_bias=bs[0], k_bias=bs[1], v_bias=bs[2], cos=cos, sin=sin, k_cache=k,
                              v_cache=v, position=at, backend=be, eager_rope=eager)
            return q, k, v, at

        def reference(x=x, ws=ws, bs=bs, cos=cos, sin=sin, mask=mask, cache=cache, pos=pos, eager=eager):
            k, v = cache[0].clone(), cache[1].clone()
            at = torch.tensor(pos, device=DEV)
            q = wk.decode_qkv(x, *ws, mask, q_bias=bs[0], k_bias=bs[1], v_bias=bs[2], cos=cos, sin=sin, k_cache=k,
                              v_cache=v, position=at, backend=REFERENCE, eager_rope=eager)
            return q, k, v, at

        yield (f"B={B} K={K} Hq={HQ} Hk={HK} D={D} G={G} bias={bias} mask={kind} eager_rope={eager}", call,
               reference, compare)
        if kind != "none":
            def split(be, x=x, ws=ws, bs=bs, cos=cos, sin=sin, mask=mask, cache=cache, pos=pos, eager=eager):
                """The two halves (`KernelOptions.decode_qkv_split`): k / v beside the router, then the routed q."""
                k, v = cache[0].clone(), cache[1].clone()
                at = torch.tensor(pos, device=DEV)
                kw = dict(q_bias=bs[0], k_bias=bs[1], v_bias=bs[2], cos=cos, sin=sin, k_cache=k, v_cache=v,
                          position=at, backend=be, eager_rope=eager)
                assert wk.decode_qkv(x, *ws, None, part="kv", **kw) is None
                return wk.decode_qkv(x, *ws, mask, part="q", **kw), k, v, at

            yield (f"B={B} K={K} Hq={HQ} Hk={HK} D={D} G={G} bias={bias} mask={kind} as kv then q", split,
                   reference, compare)


CASES = {
    "gemm_mn": _gemm_mn_cases,
    "swiglu": lambda dtype, gen: _gemm_mn_cases(dtype, gen, swiglu=True),
    "gemm_k": _gemm_k_cases,
    "ffn_experts": _ffn_experts_cases,
    "attention_prefill": _attention_prefill_cases,
    "attention_decode": _attention_decode_cases,
    "router_margin": _router_margin_cases,
    "coherent_select": _coherent_select_cases,
    "coherent_route": _coherent_route_cases,
    "rms_norm_route": _rms_norm_route_cases,
    "decode_qkv": _decode_qkv_cases,
    "gemm_k_route": _gemm_k_route_cases,
}


def test_every_op_has_contract_cases():
    assert set(CASES) == set(OPS)


@pytest.fixture
def choices(monkeypatch):
    """(backend asked for, backend that ran, the asked one's reason when it did not) of every routed call."""
    seen = []
    real = dispatch.choose

    def spy(op, backend, call, device):
        impl = real(op, backend, call, device)
        why = ""
        if impl.name != backend:
            asked = get_backend(backend)
            ok, why = asked.verify(op, **call) if asked.is_available() else (False, "unavailable")
            assert not ok and why, f"{backend} was asked for {op}, accepted it, and {impl.name} ran"
        seen.append((backend, impl.name, why))
        return impl

    monkeypatch.setattr(dispatch, "choose", spy)
    return seen


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", list(CASES))
@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_matches_the_reference(backend, op, dtype, choices, monkeypatch):
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)
    gen = torch.Generator().manual_seed(sum(map(ord, op)))
    impl = get_backend(backend)
    for label, call, reference, compare in CASES[op](dtype, gen):
        compare(call(backend), reference(), f"{backend} {op} {label}")
    mine = [c for c in choices if c[0] == backend]
    assert mine, "no call was made"
    assert all(ran in (backend, REFERENCE) for _, ran, _ in mine)
    if impl.is_available() and impl.supports(op):
        reasons = sorted({why for _, ran, why in mine if ran != backend})
        assert any(ran == backend for _, ran, _ in mine), f"{backend} declined every {op} case: {reasons}"
    else:  # not here, or not this op: every call was the reference's
        assert all(ran == REFERENCE for _, ran, _ in mine)
