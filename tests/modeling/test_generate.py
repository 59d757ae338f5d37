"""``wide.generate``: greedy decoding over a static cache, steps replayed from a CUDA graph on GPUs.

CPU: the eager loop gives HF ``generate``'s greedy tokens (routed and dense) and rejects bad input before any
compute. GPU (``pytest -m gpu tests/modeling/test_generate.py``): the graph-replayed loop gives the eager loop's
tokens with the Triton kernels, per-token and batch-coherent.
"""

from __future__ import annotations

import pytest
import torch

import wide
from tests.conftest import tiny_model
from wide.modeling.inference import enable_kernels


def _routed(device="cpu", dtype=torch.float32, backend="torch", **sizes):
    model = tiny_model("llama", **sizes).to(device, dtype)
    wide.apply_wide(model, wide.WideConfig(sparsity=0.5, router="lowrank", attn_group_size=2, ffn_group_size=32))
    model.eval()
    enable_kernels(model, backend)
    return model


def _hf_greedy(model, ids, n, **kw):
    mask = torch.ones_like(ids)
    return model.generate(ids, attention_mask=mask, max_new_tokens=n, do_sample=False, **kw)


@pytest.mark.parametrize("routed", [True, False], ids=["routed", "dense"])
def test_eager_loop_gives_hf_greedy_tokens(routed):
    model = _routed() if routed else tiny_model("llama").eval()
    ids = torch.randint(3, 96, (3, 7), generator=torch.Generator().manual_seed(0))
    got = wide.generate(model, ids, max_new_tokens=9)
    assert got.shape == (3, 16) and torch.equal(got[:, :7], ids)
    torch.testing.assert_close(got, _hf_greedy(model, ids, 9, min_new_tokens=9))


def test_eos_pads_finished_rows_and_stops_when_all_finish():
    model = _routed()
    ids = torch.randint(3, 96, (2, 5), generator=torch.Generator().manual_seed(1))
    free = wide.generate(model, ids, max_new_tokens=12)
    eos = int(free[0, 5 + 2])  # row 0's third new token
    got = wide.generate(model, ids, max_new_tokens=12, eos_token_id=eos, pad_token_id=0, check_every=1)
    row0 = got[0, 5:]
    first = int((row0 == eos).nonzero()[0])
    assert first <= 2 and (row0[first + 1:] == 0).all()
    for r in range(2):  # up to each row's first EOS the tokens are the free-running ones
        hit = (free[r, 5:] == eos).nonzero()
        end = int(hit[0]) + 1 if len(hit) else got.shape[1] - 5
        assert torch.equal(got[r, 5:5 + end], free[r, 5:5 + end])
    if not (free[1, 5:] == eos).any():
        assert got.shape[1] == 17  # row 1 never finishes: all 12 tokens
    one = wide.generate(model, ids[:1], max_new_tokens=12, eos_token_id=eos, check_every=1)
    assert one.shape[1] < 17 and one[0, -1] == eos  # the only row finished: the loop stopped there


@pytest.mark.parametrize("kwargs, field", [
    (dict(input_ids=torch.ones(2, 3)), "input_ids"),
    (dict(input_ids=torch.ones(5, dtype=torch.long)), "input_ids"),
    (dict(input_ids=torch.full((1, 3), 10**6, dtype=torch.long)), "input_ids"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(eos_token_id=-1), "eos_token_id"),
    (dict(max_cache_len=4), "max_cache_len"),
    (dict(graphs=True), "graphs"),
    (dict(check_every=0), "check_every"),
])
def test_bad_input_names_the_field(kwargs, field):
    model = _routed()
    args = dict(input_ids=torch.ones(1, 3, dtype=torch.long), max_new_tokens=4)
    args.update(kwargs)
    with pytest.raises(ValueError, match=field):
        wide.generate(model, **args)


def test_enable_kernels_turns_off_hf_auto_compile():
    model = tiny_model("llama")
    assert not model.generation_config.disable_compile
    wide.apply_wide(model, wide.WideConfig(sparsity=0.5, attn_group_size=2, ffn_group_size=32))
    enable_kernels(model, "torch")
    assert model.generation_config.disable_compile


def test_training_mode_is_refused():
    model = _routed().train()
    with pytest.raises(ValueError, match="eval"):
        wide.generate(model, torch.ones(1, 3, dtype=torch.long), max_new_tokens=2)


@pytest.mark.parametrize("coherent", [False, True], ids=["per-token", "coherent"])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graph_replayed_loop_gives_the_eager_tokens(coherent):
    model = _routed("cuda", torch.float32, "triton", num_hidden_layers=3, hidden_size=256, intermediate_size=512,
                    num_attention_heads=8, num_key_value_heads=2)
    wide.set_coherent_decode(model, 1 if coherent else None)
    ids = torch.randint(3, 96, (4, 9), generator=torch.Generator().manual_seed(2)).cuda()
    eager = wide.generate(model, ids, max_new_tokens=20, graphs=False)
    replayed = wide.generate(model, ids, max_new_tokens=20, graphs=True)
    torch.testing.assert_close(replayed, eager)  # the same kernels, issued once and replayed


def test_decode_key_lengths_are_reduced_once_per_step(monkeypatch):
    """Every layer of a decode step gets the same 4D mask: the routed attention reduces it to per-row key
    lengths in the first layer and the others reuse them (one reduction per step, not one per layer), with
    the tokens unchanged."""
    from wide.modeling import attention

    model = _routed()
    ids = torch.randint(3, 96, (3, 7), generator=torch.Generator().manual_seed(0))
    calls = []
    real = attention._count_visible
    monkeypatch.setattr(attention, "_count_visible", lambda m: calls.append(1) or real(m))
    got = wide.generate(model, ids, max_new_tokens=5)
    steps = 4  # the first new token comes from the prefill
    assert model.config.num_hidden_layers > 1 and len(calls) == steps
    torch.testing.assert_close(got, _hf_greedy(model, ids, 5, min_new_tokens=5))


@pytest.mark.parametrize("coherent", [False, True], ids=["per-token", "coherent"])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_side_stream_attention_routing_gives_the_one_stream_tokens(coherent, monkeypatch):
    """Decode steps that decide the attention mask on a side stream while K/V run (the default on CUDA) give
    the tokens of one stream, eagerly and replayed from a CUDA graph (which captures the fork and join)."""
    from wide.modeling.inference import EarlyLinear

    model = _routed("cuda", torch.float32, "triton", num_hidden_layers=3, hidden_size=256, intermediate_size=512,
                    num_attention_heads=8, num_key_value_heads=2)
    wide.set_coherent_decode(model, 1 if coherent else None)
    ids = torch.randint(3, 96, (4, 9), generator=torch.Generator().manual_seed(3)).cuda()
    early = []
    real = EarlyLinear.run_early
    monkeypatch.setattr(EarlyLinear, "run_early", lambda self, x: early.append(1) or real(self, x))
    overlapped = [wide.generate(model, ids, max_new_tokens=20, graphs=g) for g in (False, True)]
    assert len(early) >= 2 * 3 * 19  # K and V of every layer ran ahead in the eager decode steps
    wide.set_overlap_routing(model, False)
    early.clear()
    one_stream = wide.generate(model, ids, max_new_tokens=20, graphs=True)
    assert not early
    for got in overlapped:
        assert torch.equal(got, one_stream)
