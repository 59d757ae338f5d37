"""The bench's dense baselines."""


def test_sliced_dense_decode_attention_equals_the_masked_default():
    """The bench's strongest dense decode baseline computes the same step as transformers' default, and the
    attention implementation is the model's own again after the block."""
    import torch
    from transformers import StaticCache

    from tests.conftest import tiny_model
    from wide.bench.dense import SLICED, use_attention
    from wide.bench.runners import static_rewind

    model = tiny_model("llama")
    prompt, new = torch.randint(3, 96, (2, 6)), torch.randint(3, 96, (2, 1))
    outs = {}
    for impl in ("sdpa", SLICED):
        with use_attention(model, impl, keys=7):
            cache = StaticCache(config=model.config, max_cache_len=10)
            with torch.inference_mode():
                model(input_ids=prompt, past_key_values=cache, use_cache=True, cache_position=torch.arange(6))
                static_rewind(cache, 6)
                outs[impl] = model(input_ids=new, past_key_values=cache, use_cache=True,
                                   cache_position=torch.tensor([6])).logits
        assert model.config._attn_implementation == "sdpa"
    torch.testing.assert_close(outs[SLICED], outs["sdpa"], atol=1e-5, rtol=1e-4)
