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
