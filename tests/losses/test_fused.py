"""The fused linear losses equal a plain implementation with full logits (F.cross_entropy, F.kl_div), fp32 on CPU."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from wide.losses.fused import fused_linear_loss, liger_available, pick_backend


def reference(hidden, weight, labels, teacher, lm, kd, T, bias=None, softcap=None):
    """Full logits, HF's causal-LM cross-entropy and the textbook T²-scaled forward KL, token-mean."""

    def logits(h):
        z = F.linear(h, weight, bias).float()
        return z if softcap is None else softcap * torch.tanh(z / softcap)

    z = logits(hidden)
    valid = labels != -100
    ce = F.cross_entropy(z, labels, ignore_index=-100)
    total, kl = lm * ce, None
    if kd:
        zt = logits(teacher).detach()  # the teacher runs without grad
        per_token = F.kl_div(F.log_softmax(z / T, -1), F.log_softmax(zt / T, -1), log_target=True,
                             reduction="none").sum(-1)
        kl = per_token[valid].mean()
        total = total + kd * T * T * kl
    return total, ce, kl


def _inputs(n=37, d=16, v=50, seed=0, bias=False, train_head=False):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, d, generator=g, requires_grad=True)
    weight = (0.3 * torch.randn(v, d, generator=g)).requires_grad_(train_head)
    b = (0.1 * torch.randn(v, generator=g)).requires_grad_(train_head) if bias else None
    teacher = hidden.detach() + 0.5 * torch.randn(n, d, generator=g)
    labels = torch.randint(0, v, (n,), generator=g)
    labels[::4] = -100
    return hidden, weight, b, teacher, labels


CASES = [
    pytest.param(dict(lm=1.0, kd=0.0, T=1.0), id="lm-only"),
    pytest.param(dict(lm=0.0, kd=1.0, T=1.0), id="kd-only-T1"),
    pytest.param(dict(lm=0.7, kd=1.3, T=2.0), id="mixed-T2"),
    pytest.param(dict(lm=0.5, kd=2.0, T=0.5, bias=True, train_head=True), id="bias-trained-head-T0.5"),
    pytest.param(dict(lm=1.0, kd=1.0, T=3.0, softcap=4.0), id="softcap"),
]


@pytest.mark.parametrize("chunk", [1, 5, 1000], ids=["chunk1", "chunk5", "one-chunk"])
@pytest.mark.parametrize("case", CASES)
def test_chunked_torch_path_equals_full_logits(case, chunk):
    case = dict(case)
    lm, kd, T, softcap = case.pop("lm"), case.pop("kd"), case.pop("T"), case.pop("softcap", None)
    hidden, weight, bias, teacher, labels = _inputs(**case)
    want, want_ce, want_kl = reference(hidden, weight, labels, teacher, lm, kd, T, bias, softcap)
    params = [p for p in (hidden, weight, bias) if p is not None and p.requires_grad]
    want_grads = torch.autograd.grad(want, params)
    got = fused_linear_loss(hidden, weight, labels, teacher_hidden=teacher if kd else None, lm=lm, kd=kd,
                            temperature=T, bias=bias, softcap=softcap, backend="torch", chunk_size=chunk)
    assert got.path == "torch"
    torch.testing.assert_close(got.total, want, rtol=1e-5, atol=1e-6)
    if lm:
        torch.testing.assert_close(got.lm, want_ce, rtol=1e-5, atol=1e-6)
    else:
        assert got.lm is None
    if kd:
        torch.testing.assert_close(got.kd, want_kl, rtol=1e-5, atol=1e-6)
    for g, w in zip(torch.autograd.grad(got.total * 3.0, params), want_grads):
        torch.testing.assert_close(g, 3.0 * w, rtol=1e-5, atol=1e-6)


def test_nothing_counted_gives_zero_not_nan():
    hidden, weight, _, teacher, labels = _inputs()
    got = fused_linear_loss(hidden, weight, torch.full_like(labels, -100), teacher_hidden=teacher, kd=1.0,
                            temperature=2.0, backend="torch")
    assert got.total.item() == 0.0
    (grad,) = torch.autograd.grad(got.total, [hidden])
    assert torch.count_nonzero(grad) == 0


def test_no_grad_computes_no_gradient():
    hidden, weight, _, teacher, labels = _inputs()
    with torch.no_grad():
        got = fused_linear_loss(hidden, weight, labels, teacher_hidden=teacher, kd=1.0, backend="torch")
    assert not got.total.requires_grad


def test_bad_input_names_the_field():
    hidden, weight, _, teacher, labels = _inputs()
    with pytest.raises(ValueError, match="^teacher_hidden: kd > 0 needs"):
        fused_linear_loss(hidden, weight, labels, kd=1.0)
    with pytest.raises(ValueError, match="^loss.backend: must be one of auto, liger, torch"):
        fused_linear_loss(hidden, weight, labels, backend="cuda")
    with pytest.raises(ValueError, match="^labels: expected shape"):
        fused_linear_loss(hidden, weight, labels[:-1])


def test_auto_picks_torch_off_cuda_and_liger_only_where_it_covers_the_call():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert pick_backend("auto", cpu, distill=True, bias=False, softcap=None) == "torch"
    expected = "liger" if liger_available() else "torch"
    assert pick_backend("auto", cuda, distill=True, bias=False, softcap=None) == expected
    assert pick_backend("auto", cuda, distill=False, bias=True, softcap=30.0) == expected  # Liger's CE takes both
    assert pick_backend("auto", cuda, distill=True, bias=True, softcap=None) == "torch"
    assert pick_backend("auto", cuda, distill=True, bias=False, softcap=30.0) == "torch"


@pytest.mark.skipif(not liger_available(), reason="Liger-Kernel not installed (pip install 'wide[liger]')")
@pytest.mark.skipif(not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"),
                    reason="no GPU and no Triton interpreter")
@pytest.mark.parametrize("case", CASES[:3])
def test_liger_path_equals_full_logits(case):
    """Liger's fused CE + fused JSD at beta 0 (forward KL) give the reference's loss and hidden-state gradient: on
    CPU through Triton's interpreter (fp32), on the GPU for real."""
    case = dict(case)
    lm, kd, T = case.pop("lm"), case.pop("kd"), case.pop("T")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    hidden, weight, bias, teacher, labels = (t.to(dev) if t is not None else None for t in _inputs(n=21, **case))
    hidden = hidden.detach().requires_grad_()
    want, want_ce, want_kl = reference(hidden, weight, labels, teacher, lm, kd, T)
    (want_grad,) = torch.autograd.grad(want, [hidden])
    got = fused_linear_loss(hidden, weight, labels, teacher_hidden=teacher if kd else None, lm=lm, kd=kd,
                            temperature=T, backend="liger")
    assert got.path == "liger"
    torch.testing.assert_close(got.total, want, rtol=1e-5, atol=1e-5)
    if kd:
        torch.testing.assert_close(got.kd, want_kl, rtol=1e-5, atol=1e-5)
    (grad,) = torch.autograd.grad(got.total, [hidden])
    torch.testing.assert_close(grad, want_grad, rtol=1e-4, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.skipif(not liger_available(), reason="Liger-Kernel not installed")
def test_liger_and_torch_agree_in_bf16_at_a_real_vocabulary():
    """bf16 hidden states and head at a Qwen2.5-sized vocabulary: both fused paths against each other (the
    reference's full fp32 logits would take 2.4 GiB here)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    n, d, v = 2048, 1536, 151936
    hidden = torch.randn(n, d, device="cuda", generator=g, dtype=torch.bfloat16).requires_grad_()
    weight = (0.02 * torch.randn(v, d, device="cuda", generator=g)).bfloat16()
    teacher = (hidden.detach().float() + 0.3 * torch.randn(n, d, device="cuda", generator=g)).bfloat16()
    labels = torch.randint(0, v, (n,), device="cuda", generator=g)
    out = {}
    for backend in ("liger", "torch"):
        got = fused_linear_loss(hidden, weight, labels, teacher_hidden=teacher, lm=1.0, kd=1.0, temperature=2.0,
                                backend=backend)
        out[backend] = (got.total.detach(), torch.autograd.grad(got.total, [hidden])[0])
    torch.testing.assert_close(out["liger"][0], out["torch"][0], rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(out["liger"][1].float(), out["torch"][1].float(), rtol=5e-2, atol=5e-5)


def test_the_path_taken_is_logged_once(caplog, monkeypatch):
    import logging

    import wide.losses.fused as fused

    monkeypatch.setattr(fused, "_logged", set())
    hidden, weight, _, teacher, labels = _inputs()
    with caplog.at_level(logging.INFO, logger="wide.losses"):
        for _ in range(3):
            fused_linear_loss(hidden, weight, labels, teacher_hidden=teacher, kd=1.0, backend="auto")
    records = [r.getMessage() for r in caplog.records if r.name == "wide.losses"]
    assert records == ["wide.losses: fused linear loss -> torch (backend=auto, device=cpu, teacher=yes)"]
