"""The decode step's byte accounting (the bench's bandwidth floors), by hand on a tiny shape."""

import pytest
import torch

from wide.bench.floor import StepShape, decode_step_bytes, floor_fields, measure_bandwidth

# 2 layers, hidden 8, 4 q heads / 2 kv heads of dim 2, FFN 16, vocab 10, 2-byte weights and cache
SHAPE = StepShape(layers=2, hidden=8, heads=4, kv_heads=2, head_dim=2, intermediate=16, vocab=10, weight_bytes=2,
                  cache_bytes=2)
# per layer: norms 2*8 = 16, K/V proj 2*(2*2)*8 = 64, q+o 2*(4*2)*8 = 128, FFN 3*16*8 = 384 -> 592 elements;
# once: 2 embedding rows 16, final norm 8, lm_head 80 -> 104; a KV head of a row: 2 (K, V) * 5 keys * 2 * 2 B = 40 B
LAYER, SHARED, KV_HEAD = 592, 104, 40


def _masks(attn, ffn):
    return {i: {"attn": torch.tensor(attn, dtype=torch.bool), "ffn": torch.tensor(ffn, dtype=torch.bool)}
            for i in range(2)}


def test_dense_step_reads_every_weight_and_every_kv_head():
    got = decode_step_bytes(SHAPE, batch=2, keys=5)
    assert got["weights"] == (2 * LAYER + SHARED) * 2 == 2576
    assert got["kv"] == 2 * 2 * 2 * KV_HEAD == 320  # layers x rows x kv heads
    assert got == {"weights": 2576, "kv": 320, "router": 0, "total": 2896}


def test_all_on_masks_read_what_dense_reads_plus_the_routers():
    got = decode_step_bytes(SHAPE, 2, 5, _masks([[1, 1], [1, 1]], [[1] * 4] * 2), router_bytes=100)
    assert got == {"weights": 2576, "kv": 320, "router": 100, "total": 2996}


def test_all_off_masks_read_only_the_dense_parts():
    got = decode_step_bytes(SHAPE, 2, 5, _masks([[0, 0], [0, 0]], [[0] * 4] * 2), router_bytes=100)
    assert got["weights"] == (2 * (16 + 64) + SHARED) * 2 == 528  # norms, K/V projections, embeddings, lm_head
    assert got["kv"] == 0  # no query head runs: no row reads its cache
    assert got["total"] == 628


def test_a_given_mask_reads_the_union_of_the_rows_groups():
    """Layer 0: row 0 runs head group 0 (heads 0-1 = KV head 0) and FFN group 0, row 1 no head and FFN group 1;
    layer 1 has no mask (a dense layer)."""
    masks = {0: {"attn": torch.tensor([[[True, False]], [[False, False]]]),  # [B, 1, G] as a decode step records
                 "ffn": torch.tensor([[True, False, False, False], [False, True, False, False]])}}
    got = decode_step_bytes(SHAPE, 2, 5, masks)
    layer0 = 16 + 64 + 2 * 2 * 2 * 8 + 3 * 16 * 8 // 2  # 2 of 4 q heads, 2 of 4 FFN groups
    assert got["weights"] == (layer0 + LAYER + SHARED) * 2 == 2064
    assert got["kv"] == (1 + 4) * KV_HEAD == 200  # layer 0: row 0's KV head 0 only; layer 1: all


@pytest.mark.parametrize("attn, q_heads, kv_heads", [
    pytest.param([[1], [0]], 4, 2, id="one-group-of-all-heads"),
    pytest.param([[0, 1, 0, 0], [0, 0, 0, 0]], 1, 1, id="groups-of-one-head"),
    pytest.param([[0, 1, 0, 0], [0, 0, 1, 0]], 2, 2, id="rows-on-different-kv-heads"),
])
def test_head_groups_of_any_width_map_to_heads_and_kv_heads(attn, q_heads, kv_heads):
    masks = {0: {"attn": torch.tensor(attn, dtype=torch.bool)}}
    got = decode_step_bytes(SHAPE, 2, 5, masks)
    assert got["weights"] == (16 + 64 + 2 * q_heads * 2 * 8 + 384 + LAYER + SHARED) * 2
    assert got["kv"] == (kv_heads + 4) * KV_HEAD


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_dense_weights_are_the_models_parameters(tied):
    """Cross-check on a real (tiny) HF model: a dense step reads every parameter once, except the embedding
    matrix, of which it gathers B rows (tied: the matrix is read anyway, as ``lm_head``)."""
    from tests.conftest import tiny_model

    model = tiny_model("llama", tie_word_embeddings=tied).to(torch.bfloat16)
    shape = StepShape.of(model)
    assert (shape.heads, shape.kv_heads, shape.head_dim, shape.weight_bytes) == (8, 2, 16, 2)
    params = sum(p.numel() for p in model.parameters())
    emb = model.config.vocab_size * model.config.hidden_size
    expect = params + 3 * model.config.hidden_size - (0 if tied else emb)
    assert decode_step_bytes(shape, 3, 7)["weights"] == expect * 2


def test_floor_fields_without_a_bandwidth_are_none():
    nbytes = {"weights": 1, "kv": 1, "router": 0, "total": 2_000_000}
    assert floor_fields("dense", nbytes, 1.0, None) == {"dense_bytes": nbytes, "dense_floor_ms": None,
                                                        "dense_of_floor": None}
    got = floor_fields("routed", nbytes, 1.0, {"bandwidth": 4e12})
    assert got["routed_floor_ms"] == pytest.approx(0.0005) and got["routed_of_floor"] == pytest.approx(2000)
    assert measure_bandwidth("cpu") is None


def test_step_masks_are_the_last_decode_steps():
    """The masks a routed decode step recorded, per layer and kind, as the accounting takes them."""
    from transformers import DynamicCache

    import wide
    from tests.conftest import tiny_model
    from wide.bench.floor import router_bytes, step_masks
    from wide.modeling.generate import cache_kwarg

    model = tiny_model("llama")
    wide.apply_wide(model, wide.WideConfig(sparsity=0.5, attn_group_size=2, ffn_group_size=32))
    model.eval()
    cache = {cache_kwarg(model): DynamicCache(config=model.config)}
    with torch.inference_mode():
        model(input_ids=torch.randint(3, 96, (2, 6)), **cache, use_cache=True)
        model(input_ids=torch.randint(3, 96, (2, 1)), **cache, use_cache=True)
    masks = step_masks(model)
    assert sorted(masks) == [0, 1, 2] and all(sorted(m) == ["attn", "ffn"] for m in masks.values())
    assert masks[0]["attn"].shape == (2, 1, 4) and masks[0]["ffn"].shape == (2, 1, 4)
    got = decode_step_bytes(StepShape.of(model), 2, 7, masks, router_bytes(model))
    dense = decode_step_bytes(StepShape.of(model), 2, 7)
    assert got["router"] > 0 and got["weights"] < dense["weights"] + 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_measured_bandwidth_is_a_device_memory_rate():
    """On a GPU: both measures come back, in the range of device memory (H200: ~4.8 TB/s peak)."""
    got = measure_bandwidth("cuda", gib=1.0, iters=3)
    assert got["bandwidth"] == max(got["copy"], got["read"])
    assert 1e11 < got["copy"] < 2e13 and 1e11 < got["read"] < 2e13
