"""`generate_many`: prompts of any lengths through `wide.Generator` (batched by length), greedy or sampled."""

from __future__ import annotations

import pytest
import torch

import wide
from tests.conftest import tiny_model
from wide.modeling.batched import generate_many
from wide.modeling.generate import next_token


def _prompts():
    g = torch.Generator().manual_seed(0)
    lengths = [5, 3, 5, 7, 3, 5, 5, 5, 2]
    return [torch.randint(3, 96, (n,), generator=g).tolist() for n in lengths]


@pytest.mark.parametrize("routed", [False, True], ids=["dense", "routed"])
def test_batched_greedy_equals_one_prompt_at_a_time(routed):
    model = tiny_model("llama")
    if routed:
        wide.apply_wide(model, wide.WideConfig(attn_group_size=2, ffn_group_size=32)).eval()
    prompts = _prompts()
    got = generate_many(model, prompts, max_new_tokens=6, batch_size=3)
    for p, new in zip(prompts, got):
        want = wide.generate(model, torch.tensor([p]), max_new_tokens=6)[0, len(p):].tolist()
        assert new == want


def test_stop_ids_cut_the_answer_before_the_stop_token():
    model = tiny_model("llama")
    prompts = _prompts()
    full = generate_many(model, prompts, max_new_tokens=8, batch_size=4)
    stop = full[0][2]  # a token the first answer emits third
    cut = generate_many(model, prompts, max_new_tokens=8, batch_size=4, stop_ids=[stop])
    for f, c in zip(full, cut):
        assert c == (f[:f.index(stop)] if stop in f else f)


def test_sampling_is_seeded_and_near_zero_temperature_is_greedy():
    model = tiny_model("llama")
    prompts = _prompts()
    a = generate_many(model, prompts, max_new_tokens=6, batch_size=4, temperature=1.0, seed=3)
    greedy = generate_many(model, prompts, max_new_tokens=6, batch_size=4)
    assert a != greedy
    c = generate_many(model, prompts, max_new_tokens=6, batch_size=4, temperature=1.0, seed=4)
    assert a != c
    assert generate_many(model, prompts, max_new_tokens=6, batch_size=4, temperature=1.0, seed=3) == a
    assert generate_many(model, prompts, max_new_tokens=6, batch_size=4, temperature=1e-6, seed=3) == greedy


def test_next_token_samples_from_the_tempered_softmax():
    logits = torch.tensor([[0.0, 1.0, 2.0]]).expand(20000, 3)
    g = torch.Generator().manual_seed(0)
    draws = next_token(logits, temperature=2.0, generator=g)[:, 0]
    freq = torch.bincount(draws, minlength=3).float() / draws.numel()
    torch.testing.assert_close(freq, torch.softmax(logits[0] / 2.0, -1), atol=0.015, rtol=0)
    assert torch.equal(next_token(logits[:2], 0.0), torch.full((2, 1), 2))
    with pytest.raises(ValueError, match="^temperature: must be a number >= 0"):
        wide.generate(tiny_model("llama"), torch.tensor([[3, 4]]), max_new_tokens=2, temperature=-1.0)


def test_batches_sort_by_length_and_keep_the_spread():
    from wide.modeling.batched import _batches

    lengths = [5, 3, 40, 7, 3, 9, 36, 5, 2]
    assert _batches(lengths, batch_size=3, spread=4) == [[8, 1, 4], [0, 7, 3], [5], [6, 2]]
    assert _batches(lengths, batch_size=8, spread=0) == [[8], [1, 4], [0, 7], [3], [5], [6], [2]]
    for b in _batches(lengths, batch_size=2, spread=10):
        assert len(b) <= 2 and lengths[b[-1]] - lengths[b[0]] <= 10


def test_a_stop_token_inside_a_prompt_tail_does_not_end_the_row():
    """Rows of one batch feed the rest of their prompts through decode steps; a stop id among those prompt tokens
    (a chat prompt's own end-of-turn tokens) is prompt, not answer: same answers as batching equal lengths only."""
    model = tiny_model("llama")
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 96, (n,), generator=g).tolist() for n in (2, 9, 4, 12, 6)]
    stop = prompts[3][7]  # inside the longest prompt, past the shortest one's length
    exact = generate_many(model, prompts, max_new_tokens=7, batch_size=8, stop_ids=[stop], length_spread=0)
    mixed = generate_many(model, prompts, max_new_tokens=7, batch_size=8, stop_ids=[stop], length_spread=16)
    assert mixed == exact
    assert sum(len(a) for a in mixed) > 0


def test_length_spread_checked_and_coherent_decode_batches_equal_lengths(monkeypatch):
    import wide.modeling.batched as batched

    model = tiny_model("llama")
    with pytest.raises(ValueError, match="^length_spread"):
        generate_many(model, _prompts(), max_new_tokens=2, length_spread=-1)
    with pytest.raises(ValueError, match="^prompts: prompt 1"):
        generate_many(model, [[3, 4], [5, 999]], max_new_tokens=2)
    wide.apply_wide(model, wide.WideConfig(attn_group_size=2, ffn_group_size=32)).eval()
    wide.set_coherent_decode(model, 1)
    seen = []
    real = batched._batches
    monkeypatch.setattr(batched, "_batches", lambda *a: seen.append(a[2]) or real(*a))
    generate_many(model, _prompts(), max_new_tokens=2, batch_size=4)
    assert seen == [0]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_prompt_tails_through_replayed_decode_steps_on_the_gpu():
    """CUDA graphs on: the prompt tails go in between replays (the captured step reads ``_tok``), same answers as
    equal-length batches, routed with the triton kernels."""
    from wide.modeling.inference import enable_kernels

    model = tiny_model("llama").to("cuda")
    wide.apply_wide(model, wide.WideConfig(attn_group_size=2, ffn_group_size=32)).eval()
    enable_kernels(model, "triton")
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, 96, (n,), generator=g).tolist() for n in (3, 8, 5, 11, 4, 9)]
    exact = generate_many(model, prompts, max_new_tokens=9, batch_size=8, length_spread=0, graphs=True)
    mixed = generate_many(model, prompts, max_new_tokens=9, batch_size=8, length_spread=16, graphs=True)
    agree = sum(a == b for a, b in zip(exact, mixed))
    assert agree >= len(prompts) - 1, (exact, mixed)  # fp32 kernels: a near-tie may differ across batch shapes


def test_generator_checks_the_prompt_tails_shape():
    from wide.modeling.generate import Generator

    model = tiny_model("llama")
    gen = Generator(model, batch_size=2, max_cache_len=16)
    ids = torch.tensor([[3, 4], [5, 6]])
    with pytest.raises(ValueError, match="^tails:"):
        gen.generate(ids, max_new_tokens=2, tails=(torch.zeros(2, 3, dtype=torch.long), torch.tensor([3, 0])))
    with pytest.raises(ValueError, match="^tails:"):
        gen.generate(ids, max_new_tokens=4, tails=(torch.zeros(1, 3, dtype=torch.long), torch.tensor([3])))
