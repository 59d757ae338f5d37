import json
from unittest import mock

import pytest

import wide.bench
from wide.bench import bench_main


def test_bench_runs_and_writes_json(tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "bench.json"
    bench_main(["--model", tiny_model_dir, "--prefill", "16", "--decode-batch", "1", "2", "--context", "8",
                "--sparsity", "0", "0.5", "--coherent", "--iters", "1", "--ffn-group-size", "32",
                "--attn-group-size", "2", "--dtype", "fp32", "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert {(r["phase"], r["routing"]) for r in rows} == {("prefill", "per-token"), ("decode", "per-token"),
                                                          ("decode", "coherent")}
    assert len(rows) == 2 * (1 + 2 + 2)
    assert all(r["dense_ms"] > 0 and r["routed_ms"] > 0 for r in rows)
    half = next(r for r in rows if r["phase"] == "prefill" and abs(r["sparsity"] - 0.5) < 1e-9)
    assert 0.3 < half["realized"] < 0.7
    for r in rows:  # decode rows report the last timed step's realized sparsity too
        if r["phase"] == "decode":
            assert 0.0 <= r["realized"] <= 1.0
            if r["sparsity"] == 0:
                assert r["realized"] == 0.0
    out = capsys.readouterr().out
    assert "dense/routed" in out and "| realized | by weight |" in out
    # the random router skips every kind at the same rate: by weight is the same rate
    assert abs(half["realized_by_weight"] - half["realized"]) < 0.15


def test_bench_calibrates_untrained_lowrank_routers_to_each_rate(tmp_path, tiny_model_dir):
    """`--router lowrank`: random low-rank routers whose execute biases are shifted to the target's quantile skip
    about the target share at prefill, and their density hint follows each row's rate."""
    out = tmp_path / "bench.json"
    bench_main(["--model", tiny_model_dir, "--prefill", "64", "--decode-batch", "2", "--context", "8",
                "--sparsity", "0", "0.5", "--router", "lowrank", "--coherent", "--iters", "1", "--ffn-group-size",
                "32", "--attn-group-size", "2", "--dtype", "fp32", "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    prefill = {r["sparsity"]: r for r in rows if r["phase"] == "prefill"}
    assert prefill[0]["realized"] == 0.0
    assert 0.3 < prefill[0.5]["realized"] < 0.7
    assert {r["routing"] for r in rows if r["phase"] == "decode"} == {"per-token", "coherent"}


def test_bench_rejects_router_with_checkpoint(tmp_path):
    import pytest

    with pytest.raises(SystemExit, match="--router"):
        bench_main(["--checkpoint", str(tmp_path / "r.safetensors"), "--router", "lowrank"])


def test_decode_nll_equals_teacher_forced_forward():
    import torch

    from tests.conftest import tiny_model
    from wide.bench import decode_nll

    model = tiny_model("llama")
    ids = torch.randint(3, 96, (3, 12))
    logits = model(ids).logits[:, 4:-1]
    ref = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 5:].reshape(-1))
    assert abs(decode_nll(model, ids, prefix=5) - ref.item()) < 1e-4


def test_static_rewind_keeps_the_context_fixed_across_decode_steps():
    """What the CUDA-graph decode replays: one step plus a device-side rewind of the static cache."""
    import torch
    from transformers import DynamicCache, StaticCache

    from tests.conftest import tiny_model
    from wide.bench import _static_rewind

    model = tiny_model("llama")
    prompt, new = torch.randint(3, 96, (2, 6)), torch.randint(3, 96, (2, 1))
    cache = StaticCache(config=model.config, max_cache_len=8)
    with torch.inference_mode():
        model(input_ids=prompt, past_key_values=cache, use_cache=True, cache_position=torch.arange(6))
        rewind = _static_rewind(cache, 6)
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


def test_sliced_dense_decode_attention_equals_the_masked_default():
    """The bench's strongest dense decode baseline computes the same step as transformers' default."""
    import torch
    from transformers import StaticCache

    from tests.conftest import tiny_model
    from wide.bench import SLICED, _register_sliced, _slice_len, _static_rewind

    model = tiny_model("llama")
    _register_sliced()
    prompt, new = torch.randint(3, 96, (2, 6)), torch.randint(3, 96, (2, 1))
    outs = {}
    for impl in ("sdpa", SLICED):
        model.config._attn_implementation = impl
        _slice_len[0] = 7 if impl == SLICED else None
        cache = StaticCache(config=model.config, max_cache_len=10)
        with torch.inference_mode():
            model(input_ids=prompt, past_key_values=cache, use_cache=True, cache_position=torch.arange(6))
            _static_rewind(cache, 6)
            outs[impl] = model(input_ids=new, past_key_values=cache, use_cache=True,
                               cache_position=torch.tensor([6])).logits
    _slice_len[0] = None
    model.config._attn_implementation = "sdpa"
    torch.testing.assert_close(outs[SLICED], outs["sdpa"], atol=1e-5, rtol=1e-4)


def test_bench_with_trained_routers_from_a_checkpoint(tmp_path, tiny_model_dir):
    """``--checkpoint``: masks from the saved routers (lowrank, here freshly initialised) instead of synthetic
    ones; one sparsity row, the checkpoint's own target."""
    from transformers import AutoModelForCausalLM

    import wide
    from wide.checkpoint import save_trained

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    cfg = wide.WideConfig(sparsity=0.4, attn_group_size=2, ffn_group_size=32)
    wide.apply_wide(model, cfg)
    ckpt = tmp_path / "routers.safetensors"
    save_trained(model, ckpt, config=cfg, stage="calibrate")
    out = tmp_path / "bench.json"
    bench_main(["--model", tiny_model_dir, "--checkpoint", str(ckpt), "--prefill", "16", "--decode-batch", "1",
                "--context", "8", "--iters", "1", "--dtype", "fp32", "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert {r["sparsity"] for r in rows} == {0.4} and len(rows) == 2
    assert 0.0 <= rows[0]["realized"] <= 1.0 and all(r["routed_ms"] > 0 for r in rows)


def test_prefill_capture_keeps_the_eager_causal_mask_decision():
    """Under stream capture transformers would assume packed sequences and build the full causal mask (no
    flash); the bench's capture context keeps the eager decision, reads nothing on the host, and restores
    transformers afterwards."""
    import torch
    from transformers import LlamaConfig, masking_utils

    from wide.bench import _untraced_masks

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


def test_bench_compiles_both_sides(tmp_path, tiny_model_dir, capsys):
    """--compile: both forwards go through torch.compile (aot_eager here: fast on CPU); the rows still come."""
    import torch

    out = tmp_path / "bench.json"
    try:
        bench_main(["--model", tiny_model_dir, "--prefill", "16", "--decode-batch", "1", "--context", "8",
                    "--sparsity", "0.5", "--iters", "1", "--ffn-group-size", "32", "--attn-group-size", "2",
                    "--dtype", "fp32", "--compile", "aot_eager", "--json", str(out)])
    finally:
        torch._dynamo.reset()
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 2 and all(r["routed_ms"] > 0 for r in rows)
    assert json.loads(out.read_text())["args"]["compile"] == "aot_eager"
    assert "torch.compile(backend='aot_eager')" in capsys.readouterr().out


def test_bench_fuses_glue_on_both_sides(tmp_path, tiny_model_dir, capsys):
    """--fuse-glue: the dense and the routed model run with compiled norms / RoPE (and the dense MLP)."""
    import torch

    from wide.modeling.fuse import fuse_glue

    out = tmp_path / "bench.json"
    calls = []
    try:
        with mock.patch("wide.modeling.fuse.fuse_glue", side_effect=lambda m, b: calls.append(fuse_glue(m, b))):
            bench_main(["--model", tiny_model_dir, "--prefill", "16", "--decode-batch", "1", "--context", "8",
                        "--sparsity", "0.5", "--iters", "1", "--ffn-group-size", "32", "--attn-group-size", "2",
                        "--dtype", "fp32", "--fuse-glue", "aot_eager", "--json", str(out)])
    finally:
        import transformers.models.llama.modeling_llama as llama  # RoPE is fused for the process: put it back

        llama.apply_rotary_pos_emb = getattr(llama.apply_rotary_pos_emb, "_wide_original",
                                             llama.apply_rotary_pos_emb)
        torch._dynamo.reset()
    assert calls == [{"norm": 5, "rope": 2, "mlp": 2}, {"norm": 5, "rope": 2, "mlp": 0}]  # dense, then routed
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 2 and all(r["routed_ms"] > 0 for r in rows)
    assert "wide.fuse_glue" in capsys.readouterr().out


def test_decode_quality_reports_nll_and_which_groups_run_and_are_read(tiny_model_dir):
    """`wide bench --quality`'s rows: dense reads everything; per-token rows run their own groups and the
    step reads their union; coherent rows all run the same groups, so what is read is what a row runs."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import wide
    from tests.conftest import TINY_TEXT
    from wide.bench import decode_quality

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


def test_bench_reports_the_kernel_options_it_ran_under(tmp_path, tiny_model_dir, capsys, monkeypatch):
    """A table timed with an A/B kernel option (``--kernel-option skinny_swap=0``, ...) says so in its report and
    JSON; a bad option fails before any compute, naming the flag."""
    from wide.kernels import kernel_options

    monkeypatch.delenv("WIDE_KERNEL_BACKEND", raising=False)
    seen = []
    real_run = wide.bench.run
    monkeypatch.setattr(wide.bench, "run", lambda args: seen.append(kernel_options()) or real_run(args))
    out = tmp_path / "bench.json"
    bench_main(["--model", tiny_model_dir, "--prefill", "--decode-batch", "1", "--context", "8", "--sparsity", "0.5",
                "--iters", "1", "--ffn-group-size", "32", "--attn-group-size", "2", "--dtype", "fp32",
                "--kernel-option", "skinny_swap=0", "--json", str(out)])
    res = json.loads(out.read_text())
    assert res["env"] == {} and res["kernel_options"] == {"skinny_swap": False}
    assert "kernel options: skinny_swap=0" in capsys.readouterr().out
    assert [o.changed() for o in seen] == [{"skinny_swap": False}] and kernel_options().changed() == {}
    with pytest.raises(SystemExit, match="--kernel-option: unknown kernel option 'skiny_swap'"):
        bench_main(["--kernel-option", "skiny_swap=0"])


def test_bench_times_chunked_prefills_on_both_sides(tmp_path, tiny_model_dir):
    """``--prefill-chunk``: a prefill row per chunk size, both sides through `wide.Generator` (eager chunks on CPU,
    a captured chunk replayed on a GPU), beside the whole-prompt rows."""
    out = tmp_path / "bench.json"
    bench_main(["--model", tiny_model_dir, "--prefill", "40", "--prefill-chunk", "16", "--decode-batch",
                "--sparsity", "0.5", "--iters", "1", "--ffn-group-size", "32", "--attn-group-size", "2",
                "--dtype", "fp32", "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    modes = [r["mode"] for r in rows]
    assert len(rows) == 2 and modes[0] == "eager" and modes[1] == "chunks of 16, eager"
    assert all(r["dense_ms"] > 0 and r["routed_ms"] > 0 for r in rows)


def test_bench_rejects_tiny_prefill_chunks():
    import pytest

    with pytest.raises(SystemExit, match="prefill-chunk"):
        bench_main(["--prefill-chunk", "8"])
