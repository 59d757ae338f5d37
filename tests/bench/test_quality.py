"""`wide bench --quality`'s metric: decode-time NLL and the groups a row runs / a step reads."""


def test_decode_nll_equals_teacher_forced_forward():
    import torch

    from tests.conftest import tiny_model
    from wide.bench.quality import decode_nll

    model = tiny_model("llama")
    ids = torch.randint(3, 96, (3, 12))
    logits = model(ids).logits[:, 4:-1]
    ref = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 5:].reshape(-1))
    assert abs(decode_nll(model, ids, prefix=5) - ref.item()) < 1e-4


def test_decode_quality_reports_nll_and_which_groups_run_and_are_read(tiny_model_dir):
    """`wide bench --quality`'s rows: dense reads everything; per-token rows run their own groups and the
    step reads their union; coherent rows all run the same groups, so what is read is what a row runs."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import wide
    from tests.conftest import TINY_TEXT
    from wide.bench.quality import decode_quality

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    wide.apply_wide(model, wide.WideConfig(sparsity=0.5, router="lowrank", attn_group_size=2, ffn_group_size=16))
    torch.manual_seed(0)
    for r in wide.modeling.runtime_of(model).layers:
        for router in r.routers.values():
            for p in router.parameters():
                p.data.normal_(0, 0.5)  # untrained routers are near-constant: spread their decisions
    rows = decode_quality(model, tok, batch=4, prefix=4, steps=3, n_seqs=4, docs=[TINY_TEXT] * 4,
                          keep_scales=(1.0, 2.0))
    by = {r["routing"]: r for r in rows}
    assert set(by) == {"dense", "per-token", "coherent", "coherent x2"} and all(r["nll"] > 0 for r in rows)
    assert by["coherent x2"]["row_runs"] >= by["coherent"]["row_runs"]  # twice the count (capped at every group)
    assert by["dense"]["row_runs"] == by["dense"]["weights_read"] == 1.0
    assert 0 < by["per-token"]["row_runs"] < 1 and by["per-token"]["weights_read"] >= by["per-token"]["row_runs"]
    assert abs(by["coherent"]["weights_read"] - by["coherent"]["row_runs"]) < 1e-6
