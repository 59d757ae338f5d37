"""The `torch` reference against explicit formulas (it is what every other backend is tested against)."""

import math

import pytest
import torch
import torch.nn.functional as F

import wide.kernels as wk


def naive_attention(q, k, v, causal, lengths=None):
    B, T, HQ, D = q.shape
    S, HK = k.shape[1], k.shape[2]
    out = torch.zeros(B, T, HQ, D, dtype=torch.float64)
    for b in range(B):
        L = S if lengths is None else int(lengths[b])
        for h in range(HQ):
            kh = h // (HQ // HK)
            for i in range(T):
                hi = min(L, S - T + i + 1) if causal else L
                if hi <= 0:
                    continue
                s = (k[b, :hi, kh].double() @ q[b, i, h].double()) / math.sqrt(D)
                out[b, i, h] = torch.softmax(s, 0) @ v[b, :hi, kh].double()
    return out


def _attention_inputs(seed: int, B: int, T: int, S: int, density: float, HQ: int = 8, HK: int = 2, D: int = 16):
    """q ``[B, T, HQ, D]``, k / v ``[B, S, HK, D]`` (strided views of an HF cache layout), mask ``[B, T, 4]``."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, HQ, D, generator=gen)
    k = torch.randn(B, HK, S, D, generator=gen).transpose(1, 2)
    v = torch.randn(B, HK, S, D, generator=gen).transpose(1, 2)
    return q, k, v, torch.rand(B, T, 4, generator=gen) < density


@pytest.mark.parametrize("causal", [True, False])
def test_prefill_reference_matches_naive(causal):
    q, k, v, mask = _attention_inputs(seed=1, B=2, T=5, S=9, density=0.5)
    lengths = torch.tensor([9, 6])
    out = wk.attention_prefill(q, k, v, mask, causal=causal, lengths=lengths, backend="torch")
    ref = naive_attention(q, k, v, causal, lengths) * mask.repeat_interleave(2, -1)[..., None]
    assert torch.allclose(out.double(), ref, atol=1e-5)


@pytest.mark.parametrize("backend", ["torch", "gather"])
def test_prefill_chunk_over_a_cache_gives_the_whole_prompts_rows(backend):
    """A prompt chunk at positions [p, p + T) over a static cache (keys past p + T hold garbage): with
    ``q_offset = p`` and ``lengths = p + T`` its rows are the whole prompt's causal attention rows."""
    B, P = 2, 13
    q, k, v, mask = _attention_inputs(seed=3, B=B, T=P, S=24, density=0.6)
    whole = wk.attention_prefill(q, k[:, :P], v[:, :P], mask, backend="torch")
    for p, t in ((0, 5), (5, 5), (10, 3)):
        off = torch.full((B,), p, dtype=torch.int32)
        got = wk.attention_prefill(q[:, p:p + t], k, v, mask[:, p:p + t], lengths=off + t, q_offset=off,
                                   backend=backend)
        torch.testing.assert_close(got, whole[:, p:p + t], atol=1e-5, rtol=1e-5)


def test_prefill_bad_q_offset_names_the_field():
    q, kv = torch.randn(1, 2, 4, 16), torch.randn(1, 5, 2, 16)
    mask = torch.ones(1, 2, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="q_offset"):
        wk.attention_prefill(q, kv, kv, mask, q_offset=torch.zeros(2, dtype=torch.long), backend="torch")
    with pytest.raises(ValueError, match="q_offset"):
        wk.attention_prefill(q, kv, kv, mask, q_offset=torch.zeros(1), backend="torch")


def test_decode_reference_zero_length_row():
    q = torch.randn(2, 1, 4, 16)
    k = torch.randn(2, 6, 2, 16)
    mask = torch.ones(2, 1, 2, dtype=torch.bool)
    out = wk.attention_decode(q, k, k, mask, lengths=torch.tensor([0, 3]), backend="torch")
    assert (out[0] == 0).all()
    assert torch.allclose(out[1:].double(), naive_attention(q[1:], k[1:], k[1:], False, [3]), atol=1e-5)


def test_gemm_semantics_and_float_mask_gradient():
    x = torch.randn(2, 3, 64)
    w = torch.randn(96, 64)
    b = torch.randn(96)
    mask = torch.rand(2, 3, 3) < 0.5
    y = wk.gemm_mn(x, w, mask, bias=b, activation="silu")
    full = F.silu(x @ w.T + b)
    keep = mask.repeat_interleave(32, -1)
    assert torch.equal(y[~keep], torch.zeros_like(y[~keep])) and torch.allclose(y[keep], full[keep])

    mk = torch.rand(2, 3, 2) < 0.5
    yk = wk.gemm_k(x, w, mk, bias=b)
    assert torch.allclose(yk, (x * mk.repeat_interleave(32, -1)) @ w.T + b, atol=1e-5)

    gu = torch.randn(192, 64)
    ys = wk.swiglu(x, gu, mask=mask)  # concatenated gate_up weight
    assert torch.allclose(ys, F.silu(x @ gu[:96].T) * (x @ gu[96:].T) * keep, atol=1e-5)

    soft = mask.float().requires_grad_()
    wk.gemm_mn(x, w, soft).sum().backward()  # the straight-through training path
    assert torch.allclose(soft.grad, (x @ w.T).view(2, 3, 3, 32).sum(-1), atol=1e-4)


def test_shape_errors_name_the_problem():
    x = torch.randn(4, 64)
    with pytest.raises(ValueError, match="groups do not split"):
        wk.gemm_mn(x, torch.randn(96, 64), torch.ones(4, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask"):
        wk.gemm_k(x, torch.randn(96, 64), torch.ones(3, 2, dtype=torch.bool))
    # 12 q heads over 2 kv heads (6 each) in groups of 4: a group straddles two kv heads
    with pytest.raises(ValueError, match="unevenly"):
        wk.attention_prefill(torch.randn(1, 2, 12, 16), torch.randn(1, 2, 2, 16), torch.randn(1, 2, 2, 16),
                             torch.ones(1, 2, 3, dtype=torch.bool), backend="torch")
