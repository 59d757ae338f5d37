"""The bench's timing runners: the static-cache rewind a captured decode step replays, and the prefill capture's
mask context."""


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
