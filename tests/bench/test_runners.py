"""The bench's timing runners: the static-cache rewind a captured decode step replays, and the prefill capture's
mask context."""

import pytest
import torch


def test_static_rewind_keeps_the_context_fixed_across_decode_steps():
    """What the CUDA-graph decode replays: one step plus a device-side rewind of the static cache."""
    import torch
    from transformers import DynamicCache, StaticCache

    from tests.conftest import tiny_model
    from wide.bench.runners import static_rewind

    model = tiny_model("llama")
    prompt, new = torch.randint(3, 96, (2, 6)), torch.randint(3, 96, (2, 1))
    cache = StaticCache(config=model.config, max_cache_len=8)
    with torch.inference_mode():
        model(input_ids=prompt, past_key_values=cache, use_cache=True, cache_position=torch.arange(6))
        rewind = static_rewind(cache, 6)
        outs = []
        for _ in range(5):  # more steps than the cache has free slots
            outs.append(model(input_ids=new, past_key_values=cache, use_cache=True,
                              cache_position=torch.tensor([6])).logits)
            rewind()
        ref_cache = DynamicCache(config=model.config)
        model(input_ids=prompt, past_key_values=ref_cache, use_cache=True)
        ref = model(input_ids=new, past_key_values=ref_cache, use_cache=True).logits
    for out in outs:
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)


def test_prefill_capture_keeps_the_eager_causal_mask_decision():
    """Under stream capture transformers would assume packed sequences and build the full causal mask (no
    flash); the bench's capture context keeps the eager decision, reads nothing on the host, and restores
    transformers afterwards."""
    import torch
    from transformers import LlamaConfig, masking_utils

    from wide.bench.runners import _untraced_masks

    cfg = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1)
    cfg._attn_implementation = "sdpa"
    kwargs = dict(config=cfg, inputs_embeds=torch.zeros(1, 5, 16), attention_mask=None, past_key_values=None,
                  position_ids=torch.arange(5)[None])
    real_tracing, real_packed = masking_utils.is_tracing, masking_utils.find_packed_sequence_indices
    masking_utils.is_tracing = lambda *a, **k: True  # what a capture looks like to transformers
    try:
        assert masking_utils.create_causal_mask(**kwargs) is not None  # the full mask: SDPA cannot use flash
        with _untraced_masks():
            assert masking_utils.create_causal_mask(**kwargs) is None  # SDPA runs is_causal (flash)
            # transformers 5.17 asks is_tracing(padding_mask) with no padding mask: nothing to read, so no;
            # a real tensor still gets the real answer
            assert masking_utils.is_tracing(None) is False and masking_utils.is_tracing(torch.ones(2)) is True
        assert masking_utils.find_packed_sequence_indices is real_packed
        assert masking_utils.is_tracing(None) is True  # the simulated capture's answer is back
    finally:
        masking_utils.is_tracing = real_tracing


def test_decode_ids_are_the_tokens_after_each_rows_prompt_or_one_random_token():
    from unittest import mock

    import torch

    from wide.bench.models import bench_ids, decode_ids, use_text_ids

    model = mock.Mock(spec=[])
    model.config = mock.Mock(vocab_size=50)
    rnd = decode_ids(model, 3, 8, "cpu")
    assert rnd.shape == (1, 3, 1) and int(rnd.max()) < 50
    use_text_ids(model, torch.arange(100))
    ids = decode_ids(model, 2, 8, "cpu", tokens=4)
    assert ids.shape == (4, 2, 1)
    prompt = bench_ids(model, (2, 8), "cpu")
    assert ids[:, :, 0].T.tolist() == [[8, 9, 10, 11], [58, 59, 60, 61]]  # each row's prompt continues
    assert prompt[:, -1].tolist() == [7, 57]


def test_decode_runner_cycles_real_tokens_and_averages_their_rates():
    """On text ids one `step` runs a decode step per token of the pool at the same context, and `average` reads
    each token's own routing: the row's rate is the tokens' mean, not the first token's."""
    import torch

    import wide
    from tests.conftest import tiny_model
    from wide.bench.latency import _realized
    from wide.bench.models import DECODE_TOKENS, use_text_ids
    from wide.bench.runners import DecodeRunner

    model = tiny_model("llama")
    wide.apply_wide(model, wide.WideConfig(sparsity=0.5, attn_group_size=2, ffn_group_size=32)).eval()
    use_text_ids(model, torch.randint(3, 96, (400,), generator=torch.Generator().manual_seed(0)))
    runner = DecodeRunner(model, 2, 8, graphs=False)
    assert runner.tokens == DECODE_TOKENS
    runner.step()
    assert runner.cache.get_seq_length() == 8  # every step dropped its token: the context stays fixed
    mean = runner.average(lambda: _realized(model))
    rates = []
    for i in range(runner.tokens):
        runner._one(i)
        rates.append(_realized(model)["realized_by_weight"])
    assert abs(mean["realized_by_weight"] - sum(rates) / len(rates)) < 1e-6
    assert len(set(round(r, 6) for r in rates)) > 1  # tokens route differently: one token is not the rate
    assert runner.time(warmup=0, iters=1) > 0


def _per_token_by_weight(model):
    """``[B, T]`` share of the routed weights each token of the last forward skipped."""
    import wide

    st = wide.sparsity_stats(model)
    num = sum((st.token_active[k].float() * st.weights[k]).sum(-1) for k in st.kinds)
    return 1 - num / sum(st.weights[k].sum() for k in st.kinds)


def test_decode_runner_decodes_its_tokens_in_sequence_as_generation_does():
    """Token i of a decode row is stepped at position context + i with tokens 0..i-1 in the cache: its routing and
    logits are those of the same tokens in one forward over the whole text (a text with holes routed otherwise)."""
    import torch

    import wide
    from tests.conftest import tiny_model
    from wide.bench.models import DECODE_TOKENS, bench_ids, use_text_ids
    from wide.bench.runners import DecodeRunner

    torch.manual_seed(0)
    model = tiny_model("llama")
    wide.apply_wide(model, wide.WideConfig(sparsity=0.5, attn_group_size=2, ffn_group_size=32)).eval()
    use_text_ids(model, torch.randint(3, 96, (400,), generator=torch.Generator().manual_seed(0)))
    ctx = 8
    runner = DecodeRunner(model, 2, ctx, graphs=False)
    full = torch.cat([bench_ids(model, (2, ctx), "cpu"), runner.pool[:, :, 0].T], dim=1)  # [B, ctx + K]
    with torch.inference_mode():
        ref_logits = model(input_ids=full).logits[:, ctx:]
        ref = _per_token_by_weight(model)[:, ctx:]
        seen = []
        for i in range(runner.tokens):
            runner._one(i)
            seen.append(_per_token_by_weight(model)[:, 0])
        assert runner.cache.get_seq_length() == ctx  # back at the prompt for the next round
        torch.testing.assert_close(torch.stack(seen, 1), ref)
        # the same tokens once more: the cache was cut back, so the round repeats exactly
        last = None
        for i in range(runner.tokens):
            runner._one(i)
            if i == 2:
                last = _per_token_by_weight(model)[:, 0]
        torch.testing.assert_close(last, ref[:, 2])
    assert runner.tokens == DECODE_TOKENS and ref_logits.shape[1] == DECODE_TOKENS


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (graphs)")
def test_decode_runner_graph_steps_match_the_eager_sequence():
    """On the GPU the captured step reads its position from a device buffer: each replay writes and routes token i at
    context + i (the static cache's counter is set from that buffer), as the eager dynamic-cache steps do."""
    import wide
    from tests.conftest import tiny_model
    from wide.bench.models import use_text_ids
    from wide.bench.runners import DecodeRunner

    torch.manual_seed(0)
    model = tiny_model("llama").cuda()
    wide.apply_wide(model, wide.WideConfig(sparsity=0.5, attn_group_size=2, ffn_group_size=32)).eval()
    use_text_ids(model, torch.randint(3, 96, (400,), generator=torch.Generator().manual_seed(0)))
    rates = {}
    for graphs in (False, True):
        runner = DecodeRunner(model, 2, 8, graphs=graphs)
        assert runner.mode == ("graph" if graphs else "eager")
        rates[graphs] = []
        for _ in range(2):  # two rounds: the second starts at the prompt again
            for i in range(runner.tokens):
                runner._one(i)
                rates[graphs].append(_per_token_by_weight(model)[:, 0].clone())
    torch.testing.assert_close(torch.stack(rates[True]), torch.stack(rates[False]))
