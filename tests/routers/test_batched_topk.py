"""Batched training-free top-k (`router: batched_topk`): the period / memory schedule and the realized rate."""

import pytest
import torch

import wide
from tests.conftest import tiny_model
from tests.routers.test_contract import _decode_masks
from wide.routers import BatchedTopKRouter, RouterSpec


def _router(period, memory, groups=4, sparsity=0.5, prefill="shared"):
    # identity scores: a group's importance is the |RMS-normalised residual| at its own coordinate
    spec = RouterSpec("ffn", 0, 1, groups, groups, 8, sparsity, group_scores=lambda: torch.eye(groups))
    return BatchedTopKRouter(spec, period=period, memory=memory, prefill=prefill).eval()


def _reference(prefill_mean, steps, period, memory, keep):
    """The documented schedule in plain Python: selections after the prefill and after every decode step."""
    def top(v):
        order = sorted(range(len(v)), key=lambda i: (-v[i], i))
        return [i in order[:keep] for i in range(len(v))]

    mem, acc, sel = list(prefill_mean), [0.0] * len(prefill_mean), top(prefill_mean)
    out = [sel]
    for i, x in enumerate(steps, start=1):
        acc = [a + b for a, b in zip(acc, x)]
        if i % period == 0:
            mem = [memory * m + (1 - memory) * a / period for m, a in zip(mem, acc)]
            sel, acc = top(mem), [0.0] * len(acc)
        out.append(sel)
    return out


@pytest.mark.parametrize("period,memory", [(1, 0.0), (3, 0.0), (3, 0.6), (5, 0.9)])
def test_reselection_happens_exactly_every_period_steps(period, memory):
    torch.manual_seed(period)
    r = _router(period, memory, groups=6)
    prompt = torch.randn(3, 7, 6)
    # a strong group that moves every 4 steps, so that refreshes change the selection
    decode = [torch.randn(3, 1, 6) + 4 * torch.nn.functional.one_hot(torch.tensor(i // 4 % 6), 6) for i in range(17)]
    with torch.no_grad():
        masks = [r(prompt)[..., 0] > 0] + [r(h)[..., 0] > 0 for h in decode]
    imp = lambda h: (torch.nn.functional.rms_norm(h, (6,), eps=1e-6).abs()).mean((0, 1)).tolist()  # noqa: E731
    want = _reference(imp(prompt), [imp(h) for h in decode], period, memory, r.keep)
    got = [m[0, 0].tolist() for m in masks]
    assert got == want
    for i in range(1, len(got)):
        if i % period:
            assert got[i] == got[i - 1], f"selection changed at decode step {i}, not a multiple of {period}"
    assert all(bool((m == m[:1, :1]).all()) for m in masks), "one mask for every token of the batch"
    assert any(got[i] != got[i - 1] for i in range(period, len(got), period)), "the data should move the selection"


def test_memory_keeps_a_recurring_group_through_a_weak_period():
    prompt = torch.tensor([5.0, 5.0, 1.0, 1.0]).expand(2, 4, 4)  # groups 0 and 1 strong in the prompt
    dip = torch.tensor([1.0, 5.0, 5.0, 1.0]).expand(2, 1, 4)  # group 0 weak for one period, group 2 strong
    for memory, keeps_zero in ((0.0, False), (0.75, True)):
        r = _router(period=2, memory=memory)
        with torch.no_grad():
            r(prompt)
            r(dip)
            mask = r(dip)[0, 0, :, 0] > 0  # the refresh step
        assert mask.tolist() == ([True, True, False, False] if keeps_zero else [False, True, True, False])


def test_prefill_token_mode_keeps_per_token_topk_and_the_same_memory():
    torch.manual_seed(0)
    prompt = torch.randn(2, 5, 4)
    shared, token = _router(2, 0.5), _router(2, 0.5, prefill="token")
    with torch.no_grad():
        a, b = shared(prompt)[..., 0] > 0, token(prompt)[..., 0] > 0
    assert (a == a[:1, :1]).all() and not (b == b[:1, :1]).all()
    assert (b.sum(-1) == 2).all()
    assert torch.equal(shared.mem, token.mem) and torch.equal(shared.selection, token.selection)


def test_bad_settings_name_the_field():
    for kw, field in ((dict(period=0), "period"), (dict(memory=1.0), "memory"), (dict(prefill="x"), "prefill")):
        with pytest.raises(ValueError, match=f"^{field}:"):
            BatchedTopKRouter(RouterSpec("ffn", 0, 1, 4, 4, 8, 0.5, group_scores=lambda: torch.eye(4)), **kw)
    with pytest.raises(ValueError, match="^router: 'batched_topk'"):
        wide.apply_wide(tiny_model("llama"), wide.WideConfig(router="batched_topk", granularity="layer"))


def _read_skip(steps):
    """Per decode step and sub-layer: the share of groups no row of the step runs (the weights it need not read)."""
    return [(~m.reshape(m.shape[0], -1)[:, :].bool().any(0)).float().mean().item() for s in steps for m in s.values()]


@pytest.mark.parametrize("kernels", [None, "torch"], ids=["reference", "kernels-torch"])
@pytest.mark.parametrize("batch", [1, 4, 16])
def test_realized_rate_is_the_target_at_every_batch_size(batch, kernels):
    cfg = dict(sparsity=0.5, attn_group_size=2, ffn_group_size=32)  # 4 groups of each kind: 2 kept, exactly 50%
    model = tiny_model("llama", num_hidden_layers=2)
    wide.apply_wide(model, wide.WideConfig(router="batched_topk", **cfg))
    if kernels:
        wide.enable_kernels(model, kernels)
    ids = torch.randint(3, 96, (batch, 6), generator=torch.Generator().manual_seed(batch))
    steps = _decode_masks(model, ids, 6)
    assert steps and all(rate == 0.5 for rate in _read_skip(steps))
    with torch.no_grad():
        model(ids)
    stats = wide.sparsity_stats(model)
    assert stats.realized().item() == 0.5 and stats.realized_by_weight().item() == 0.5
    if batch == 16:  # per-token top-k at the same rate: the step must read what any row runs
        per_token = tiny_model("llama", num_hidden_layers=2)
        wide.apply_wide(per_token, wide.WideConfig(router="topk", **cfg))
        rates = _read_skip(_decode_masks(per_token, ids, 6))
        assert sum(rates) / len(rates) < 0.4


def test_a_prefill_restarts_the_sequence_in_place():
    """A new prompt starts the schedule again on the same tensors (a captured decode step keeps pointing at them)."""
    model = tiny_model("llama", num_hidden_layers=1)
    wide.apply_wide(model, wide.WideConfig(router="batched_topk", attn_group_size=2, ffn_group_size=32))
    r = model.model.layers[0].wide.routers["ffn"]
    ids = torch.randint(3, 96, (2, 5))
    _decode_masks(model, ids, 4)
    ptrs = [t.data_ptr() for t in (r.mem, r.acc, r.selection, r.step)]
    assert r.step.item() == 3
    _decode_masks(model, ids, 2)
    assert r.step.item() == 1 and ptrs == [t.data_ptr() for t in (r.mem, r.acc, r.selection, r.step)]


def test_wide_generate_decodes_under_the_schedule():
    model = tiny_model("llama", num_hidden_layers=2)
    wide.apply_wide(model, wide.WideConfig(router="batched_topk", attn_group_size=2, ffn_group_size=32))
    wide.enable_kernels(model, "torch")
    ids = torch.randint(3, 96, (4, 6), generator=torch.Generator().manual_seed(0))
    ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=5, do_sample=False)
    out = wide.generate(model, ids, max_new_tokens=5)
    assert torch.equal(out, ref)
