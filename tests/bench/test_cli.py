"""`wide bench` end to end on a tiny model: the rows, their JSON fields, and the flags' errors."""

import json
from unittest import mock

import pytest

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
    # bandwidth floors: the bytes each side reads a step; no bandwidth off CUDA, so no floors, and the report says so
    assert json.loads((tmp_path / "bench.json").read_text())["bandwidth"] is None
    assert "no floors: the device bandwidth is measured on CUDA only" in out and "| n/a | n/a |" in out
    for r in rows:
        if r["phase"] == "decode":
            assert r["dense_floor_ms"] is None and r["routed_floor_ms"] is None and r["routed_of_floor"] is None
            assert r["dense_bytes"]["router"] == 0 and r["routed_bytes"]["router"] == 0  # random routers: no weights
            if r["sparsity"] == 0:  # every group runs: the routed step reads what the dense one does
                assert r["routed_bytes"] == r["dense_bytes"]
            elif r["routing"] == "coherent" or r["batch"] == 1:  # one mask for the batch: half the routed groups
                assert r["routed_bytes"]["total"] < r["dense_bytes"]["total"]
            assert r["dense_variant"] == r["mode"].split("dense ")[1].split(" / routed")[0]
        else:
            assert "dense_floor_ms" not in r


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


def test_bench_ids_cut_rows_from_the_text_stream_or_are_random():
    import torch

    from wide.bench.models import bench_ids, use_text_ids

    model = mock.Mock(spec=[])
    model.config = mock.Mock(vocab_size=50)
    rnd = bench_ids(model, (2, 7), "cpu")
    assert rnd.shape == (2, 7) and int(rnd.max()) < 50
    use_text_ids(model, torch.arange(10))
    ids = bench_ids(model, (2, 7), "cpu")
    assert ids.tolist() == [[0, 1, 2, 3, 4, 5, 6], [5, 6, 7, 8, 9, 0, 1]]  # row r at r * n / rows, wrapping


def test_bench_times_trained_routers_on_text_and_says_so(tmp_path, tiny_model_dir, tiny_corpus, capsys):
    """``--checkpoint`` reads text by default (``--ids auto``): every timed forward's ids come from the source's
    token stream, in the model's tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import wide
    from wide.bench import runners
    from wide.io.checkpoint import save_trained

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    cfg = wide.WideConfig(sparsity=0.4, attn_group_size=2, ffn_group_size=32)
    wide.apply_wide(model, cfg)
    ckpt = tmp_path / "routers.safetensors"
    save_trained(model, ckpt, config=cfg, stage="calibrate")
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    vocab = set()
    for doc in open(tiny_corpus).read().split("\n\n"):
        vocab |= set(tok(doc, add_special_tokens=False)["input_ids"])
    seen = []
    real = runners.bench_ids
    with mock.patch.object(runners, "bench_ids", lambda *a, **k: seen.append(real(*a, **k)) or seen[-1]):
        bench_main(["--model", tiny_model_dir, "--checkpoint", str(ckpt), "--text-source", tiny_corpus,
                    "--prefill", "16", "--decode-batch", "2", "--context", "8", "--iters", "1", "--dtype", "fp32",
                    "--json", str(tmp_path / "b.json")])
    assert seen and all(set(t.flatten().tolist()) <= vocab | {tok.eos_token_id} for t in seen)
    assert f"token ids: text ({tiny_corpus!r}" in capsys.readouterr().out
    assert json.loads((tmp_path / "b.json").read_text())["args"]["ids"] == "text"


@pytest.mark.parametrize("args, message", [
    (["--ids", "text"], "--ids text needs --model"),
    (["--model", "x", "--ids", "text", "--text-source", "missing.txt"], "--text-source"),
])
def test_bench_text_ids_fail_before_loading(args, message):
    with pytest.raises(SystemExit, match=message):
        bench_main(args)


def test_bench_with_trained_routers_from_a_checkpoint(tmp_path, tiny_model_dir):
    """``--checkpoint``: masks from the saved routers (lowrank, here freshly initialised) instead of synthetic
    ones; one sparsity row, the checkpoint's own target."""
    from transformers import AutoModelForCausalLM

    import wide
    from wide.io.checkpoint import save_trained

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    cfg = wide.WideConfig(sparsity=0.4, attn_group_size=2, ffn_group_size=32)
    wide.apply_wide(model, cfg)
    ckpt = tmp_path / "routers.safetensors"
    save_trained(model, ckpt, config=cfg, stage="calibrate")
    out = tmp_path / "bench.json"
    bench_main(["--model", tiny_model_dir, "--checkpoint", str(ckpt), "--prefill", "16", "--decode-batch", "1",
                "--context", "8", "--iters", "1", "--dtype", "fp32", "--ids", "random", "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert {r["sparsity"] for r in rows} == {0.4} and len(rows) == 2
    assert 0.0 <= rows[0]["realized"] <= 1.0 and all(r["routed_ms"] > 0 for r in rows)


def test_bench_decodes_a_real_shape_with_trained_routers_at_batch_1_4_16(tmp_path):
    """The issue's rows: ``--checkpoint ... --decode-batch 1 4 16 --prefill`` (no prefill rows) on a SmolLM2-like
    shape (3 query heads per KV head in one routing group, tied embeddings, FFN groups of 64): a decode row per
    batch and routing, each with both sides' bytes a step; the routed side also reads its low-rank routers."""
    from transformers import AutoModelForCausalLM

    import wide
    from tests.conftest import tiny_config
    from wide.io.checkpoint import save_trained

    folder = tmp_path / "smol"
    AutoModelForCausalLM.from_config(tiny_config("llama", num_attention_heads=9, num_key_value_heads=3,
                                                 hidden_size=72, head_dim=8, intermediate_size=192,
                                                 num_hidden_layers=2, tie_word_embeddings=True)).save_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    cfg = wide.WideConfig(sparsity=0.5, attn_group_size=3, ffn_group_size=64, router="lowrank", router_rank=8)
    wide.apply_wide(model, cfg)
    save_trained(model, tmp_path / "routers.safetensors", config=cfg, stage="calibrate")
    out = tmp_path / "bench.json"
    bench_main(["--model", str(folder), "--checkpoint", str(tmp_path / "routers.safetensors"), "--decode-batch", "1",
                "4", "16", "--prefill", "--coherent", "--context", "8", "--iters", "1", "--dtype", "fp32",
                "--json", str(out)])
    result = json.loads(out.read_text())
    assert result["args"]["ids"] == "random"  # --ids auto: the folder has no tokenizer, so random ids
    rows = result["rows"]
    assert [(r["phase"], r["batch"], r["routing"]) for r in rows] == [
        ("decode", b, routing) for routing in ("per-token", "coherent") for b in (1, 4, 16)]
    for r in rows:
        assert r["routed_ms"] > 0 and r["dense_ms"] > 0 and 0.0 <= r["realized"] <= 1.0
        # 2 layers x 2 routers (attention, FFN; 3 groups each) x fp32 (down [8, 72], up [2 x 3, 8] and its bias)
        assert r["routed_bytes"]["router"] == 2 * 2 * 4 * (8 * 72 + 2 * 3 * (8 + 1))
        assert r["dense_bytes"]["kv"] == 2 * r["batch"] * 3 * 2 * 9 * 8 * 4  # layers x rows x KV heads x K/V x keys
        assert r["routed_bytes"]["kv"] <= r["dense_bytes"]["kv"]


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


def test_bench_reports_the_kernel_options_it_ran_under(tmp_path, tiny_model_dir, capsys, monkeypatch):
    """A table timed with an A/B kernel option (``--kernel-option skinny_swap=0``, ...) says so in its report and
    JSON; a bad option fails before any compute, naming the flag."""
    import wide.bench.cli as cli
    from wide.kernels import kernel_options

    monkeypatch.delenv("WIDE_KERNEL_BACKEND", raising=False)
    seen = []
    real_run = cli.run_latency
    monkeypatch.setattr(cli, "run_latency", lambda *a: seen.append(kernel_options()) or real_run(*a))
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


def test_bench_times_a_compiled_dense_step_and_skips_one_that_fails(tmp_path, tiny_model_dir, capsys, monkeypatch):
    """``--dense-compile``: the fastest dense variant once more with the whole step under torch.compile (aot_eager
    here, eager steps on the CPU); the fastest of all stays the baseline and the row names it. A compile that
    fails costs the variant only, with one line saying why; modes with CUDA graphs of their own are refused."""
    import torch

    # (fused decode launches off: their dense candidate is the next test's subject)
    args = ["--model", tiny_model_dir, "--prefill", "--decode-batch", "2", "--context", "8", "--sparsity", "0.5",
            "--iters", "1", "--ffn-group-size", "32", "--attn-group-size", "2", "--dtype", "fp32",
            "--kernel-option", "decode_qkv=0", "--kernel-option", "decode_residual=0"]
    out = tmp_path / "bench.json"
    try:
        bench_main(args + ["--dense-compile", "aot_eager", "--json", str(out)])
    finally:
        torch._dynamo.reset()
    (row,) = json.loads(out.read_text())["rows"]
    assert list(row["dense_variants"]) == ["hf-sdpa (eager)", "compiled hf-sdpa (eager)"]
    assert row["dense_variant"] == min(row["dense_variants"], key=row["dense_variants"].get)
    assert row["dense_ms"] == row["dense_variants"][row["dense_variant"]]
    capsys.readouterr()

    def broken(*a, **k):
        raise RuntimeError("no compiler here\nsecond line")

    monkeypatch.setattr(torch, "compile", broken)
    bench_main(args + ["--dense-compile", "--json", str(out)])
    (row,) = json.loads(out.read_text())["rows"]
    assert row["dense_variant"] == "hf-sdpa (eager)" and row["routed_ms"] > 0
    assert "compiled hf-sdpa (failed: RuntimeError: no compiler here) skipped" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--dense-compile: mode 'reduce-overhead'"):
        bench_main(["--dense-compile", "reduce-overhead"])
    with pytest.raises(SystemExit, match="--compile"):
        bench_main(["--dense-compile", "--compile"])


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")
def test_bench_on_gpu_has_floors_and_captures_the_compiled_dense_step(tmp_path, tiny_model_dir):
    """On a GPU (tiny model, bf16, graphs): the decode rows have both sides' floors from the measured bandwidth,
    and the compiled dense step (inductor) is captured in a CUDA graph like the other variants."""
    import torch

    out = tmp_path / "bench.json"
    try:
        bench_main(["--model", tiny_model_dir, "--prefill", "--decode-batch", "1", "4", "--context", "64",
                    "--sparsity", "0", "0.5", "--iters", "2", "--ffn-group-size", "32", "--attn-group-size", "2",
                    "--dense-compile", "--json", str(out)])
    finally:
        torch._dynamo.reset()
    res = json.loads(out.read_text())
    assert res["bandwidth"]["bandwidth"] > 1e11
    for r in res["rows"]:
        assert r["dense_floor_ms"] > 0 and r["routed_floor_ms"] > 0 and r["dense_of_floor"] > 0.1
        assert any(k.startswith("compiled ") and k.endswith("(graph)") for k in r["dense_variants"]), r["dense_variants"]
        assert r["mode"].endswith("routed graph")
        if r["sparsity"] == 0:
            assert r["routed_bytes"]["weights"] == r["dense_bytes"]["weights"]


def test_bench_help_names_every_kernel_option():
    """`wide bench`'s parser spells the options out (it imports no torch); every `KernelOptions` field is there."""
    import dataclasses

    from wide.bench.cli import parser
    from wide.kernels.options import KernelOptions

    text = parser().format_help().replace("\n", " ")
    for f in dataclasses.fields(KernelOptions):
        assert f.name in text, f"wide bench --help does not name the kernel option {f.name}"


def test_bench_times_the_dense_step_with_the_same_fused_launches(tmp_path, tiny_model_dir):
    """With the fused decode launches on (the defaults), the dense candidates include the routed model's own dense
    step (routing off) through the same fused launches; the baseline is the fastest candidate."""
    out = tmp_path / "bench.json"
    bench_main(["--model", tiny_model_dir, "--prefill", "--decode-batch", "1", "--context", "8", "--sparsity", "0.5",
                "--iters", "1", "--ffn-group-size", "32", "--attn-group-size", "2", "--dtype", "fp32",
                "--json", str(out)])
    row = json.loads(out.read_text())["rows"][0]
    fused = [k for k in row["dense_variants"] if k.startswith("wide-fused ")]
    assert len(fused) == 1 and row["dense_variants"][fused[0]] > 0
    assert row["dense_ms"] == min(row["dense_variants"].values())


def test_bench_takes_a_stage_2_checkpoint_with_its_lora_merged(tmp_path, tiny_model_dir, tiny_corpus):
    """A stage-2 file (routers + LoRA, here LoRARecovery without a router checkpoint: the joint recipe's kind) benches
    as deployed: its adapter merged into the weights, so the routers read the hidden states they were trained on.
    Until 2026-12-05 `wide bench --checkpoint` loaded routers only and failed on the LoRA tensors."""
    from tests.test_recipes import tiny_args
    from wide.cli import main
    from wide.io.loading import load_model

    main(["fit", "--config", "recipes/smollm2-135m/lora_distill.yaml", *tiny_args(tmp_path, tiny_model_dir, tiny_corpus),
          "--model.init_args.router_checkpoint", "null", "--model.init_args.routing",
          json.dumps({"sparsity": 0.5, "attn_group_size": 2, "ffn_group_size": 32}), "--trainer.fast_dev_run", "1"])
    ckpt = tmp_path / "wide" / "routers.safetensors"
    out = tmp_path / "bench.json"
    bench_main(["--model", tiny_model_dir, "--checkpoint", str(ckpt), "--prefill", "16", "--decode-batch", "1",
                "--context", "8", "--iters", "1", "--dtype", "fp32", "--ids", "random", "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert {r["sparsity"] for r in rows} == {0.5} and all(r["routed_ms"] > 0 for r in rows)
    # the model bench timed is the one `wide eval` scores: LoRA merged, no adapter module left
    loaded = load_model(tiny_model_dir, checkpoint=str(ckpt), device="cpu", dtype="float32")
    assert loaded.info["checkpoint"]["adapter_merged"] and loaded.info["checkpoint"]["lora"]
    assert not any("lora_" in n for n, _ in loaded.model.named_parameters())
