"""`wide export` (checkpoint -> routed model folder) and `wide generate` (text from that folder)."""

import json
import re

import pytest
import torch

import wide
from wide.io.checkpoint import save_trained
from wide.cli import main

CFG = dict(sparsity=0.5, router="lowrank", attn_group_size=2, ffn_group_size=32)


def _checkpoint(tiny_model_dir, tmp_path, lora: bool):
    """A stage-1 (or, with LoRA, stage-2) checkpoint with non-trivial router / LoRA tensors, as `wide fit` leaves."""
    from peft import LoraConfig, inject_adapter_in_model
    from transformers import AutoModelForCausalLM

    cfg = wide.WideConfig(**CFG)
    model = wide.apply_wide(AutoModelForCausalLM.from_pretrained(tiny_model_dir), cfg)
    if lora:
        inject_adapter_in_model(LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "down_proj"]), model)
    torch.manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".wide.routers." in f".{name}" or "lora_" in name:
                p.normal_(0, 0.5)
    extra = {"model": tiny_model_dir, **({"lora_alpha": 8} if lora else {})}
    return save_trained(model, tmp_path / "routers.safetensors", config=cfg, stage="lora" if lora else "calibrate",
                        step=7, extra=extra)


@pytest.mark.parametrize("lora", [False, True], ids=["calibrate", "lora"])
def test_export_writes_a_folder_that_loads_with_the_checkpoint_logits(tiny_model_dir, tmp_path, capsys, lora):
    from wide.io.loading import load_model

    ckpt = _checkpoint(tiny_model_dir, tmp_path, lora)
    out = tmp_path / "new" / "exported"  # parents made
    assert main(["export", "--checkpoint", str(ckpt), "--out", str(out)]) == 0
    assert "wide export: wrote" in capsys.readouterr().out
    assert {"config.json", "model.safetensors", "routers.safetensors", "wide.json"} <= {p.name for p in out.iterdir()}
    meta = json.loads((out / "wide.json").read_text())
    assert meta["exported_from"]["checkpoint"]["stage"] == ("lora" if lora else "calibrate")
    ref = load_model(checkpoint=str(ckpt), device="cpu").model  # LoRA merged, as evaluated
    got = wide.load(out, kernels=False)
    assert not any("lora_" in n for n, _ in got.named_parameters()) and got.config.use_cache
    ids = torch.randint(3, 90, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(got(input_ids=ids).logits, ref(input_ids=ids).logits)


def test_export_keeps_an_existing_folder_unless_forced(tiny_model_dir, tmp_path, capsys):
    ckpt = _checkpoint(tiny_model_dir, tmp_path, False)
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["export", "--checkpoint", str(ckpt), "--out", str(out)]) == 2
    assert "out:" in capsys.readouterr().err and (out / "keep.txt").read_text() == "mine"
    assert main(["export", "--checkpoint", str(ckpt), "--out", str(out), "--force"]) == 0
    assert not (out / "keep.txt").exists() and (out / "routers.safetensors").is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".taken.")] == []  # no temp folder left


def test_export_bad_checkpoint_names_it_before_loading(tmp_path, capsys):
    bad = tmp_path / "nope.safetensors"
    bad.write_bytes(b"not a safetensors file")
    assert main(["export", "--checkpoint", str(bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "wide export: error:" in err and "nope.safetensors" in err and not (tmp_path / "o").exists()


@pytest.fixture()
def exported(tiny_model_dir, tmp_path):
    out = tmp_path / "exported"
    assert main(["export", "--checkpoint", str(_checkpoint(tiny_model_dir, tmp_path, True)), "--out", str(out)]) == 0
    return out


def _greedy_to_eos(model, tok, prompt: str, n: int, **kw) -> list[int]:
    """``wide.generate``'s new tokens for ``prompt``, up to and with the first EOS (what `wide generate` records)."""
    ids = torch.tensor([tok(prompt)["input_ids"]])
    want = wide.generate(model, ids, max_new_tokens=n, eos_token_id=tok.eos_token_id, **kw)[0, ids.shape[1]:].tolist()
    return want[: want.index(tok.eos_token_id) + 1] if tok.eos_token_id in want else want


def test_generate_prints_completions_speed_and_skipped_share(exported, tmp_path, capsys):
    capsys.readouterr()
    js = tmp_path / "gen.json"
    rc = main(["generate", str(exported), "--prompt", "the cat sat on", "--prompt", "a dog ran", "--max-new-tokens", "6",
               "--device", "cpu", "--json", str(js)])
    io = capsys.readouterr()
    assert rc == 0, io.err
    recs = json.loads(js.read_text())["records"]
    assert [r["prompt"] for r in recs] == ["the cat sat on", "a dog ran"] and "### the cat sat on" in io.out
    model = wide.load(exported)
    tok = __import__("transformers").AutoTokenizer.from_pretrained(exported)
    for r in recs:
        want = _greedy_to_eos(model, tok, r["prompt"], 6)
        assert r["new_tokens"] == len(want) and r["completion"] == tok.decode(want, skip_special_tokens=True)
        assert set(r["skipped"]) == {"attn", "ffn", "total", "by_weight"} and 0 < r["skipped"]["by_weight"] < 1
        assert r["tokens_per_s"] > 0
    assert "of routed weights]" in io.out


def test_generate_with_column_major_weights_gives_the_row_major_completions(exported, tmp_path, capsys):
    from wide.modeling.layout import weight_layout

    recs = {}
    for lay in ("row", "column"):
        js = tmp_path / f"{lay}.json"
        assert main(["generate", str(exported), "--prompt", "the cat sat on", "--max-new-tokens", "6", "--device", "cpu",
                     "--weight-layout", lay, "--json", str(js)]) == 0
        recs[lay] = [r["completion"] for r in json.loads(js.read_text())["records"]]
    assert recs["column"] == recs["row"]
    model = wide.load(exported, weight_layout="column")
    assert weight_layout(model.model.layers[0].mlp.down_proj.weight) == "column"
    with pytest.raises(ValueError, match="weight_layout: one of row, column, got 'col'"):
        wide.load(exported, weight_layout="col")


def test_generate_with_dense_prompts_routes_only_the_new_tokens(exported, tmp_path, capsys):
    capsys.readouterr()
    js = tmp_path / "dense.json"
    rc = main(["generate", str(exported), "--prompt", "the cat sat on", "--max-new-tokens", "6", "--device", "cpu",
               "--prefill", "dense", "--json", str(js)])
    io = capsys.readouterr()
    assert rc == 0, io.err
    got = json.loads(js.read_text())
    assert got["prefill"] == "dense" and "prompts dense" in io.err
    model = wide.load(exported)
    tok = __import__("transformers").AutoTokenizer.from_pretrained(exported)
    ids = torch.tensor([tok("the cat sat on")["input_ids"]])
    want = _greedy_to_eos(model, tok, "the cat sat on", 6, prefill="dense")
    rec = got["records"][0]
    assert rec["tokens"] == want and rec["new_tokens"] == len(want)
    from wide.modeling.compare import skipped_share

    whole = torch.cat([ids, torch.tensor([want])], dim=1)
    assert rec["skipped"] == pytest.approx(skipped_share(model, whole, ids.shape[1]))
    assert set(rec["skipped"]) == {"attn", "ffn", "total", "by_weight"}


@pytest.mark.parametrize("args, field", [
    (["--max-new-tokens", "0", "--prompt", "x"], "max-new-tokens"),
    ([], "prompt"),
    (["--prompt-file", "/no/such/file"], "prompt-file"),
    (["--prompt", "x", "--chat"], "chat"),
    (["--compare"], "prompt"),
    (["--compare", "--prompt", "x", "--max-new-tokens", "0"], "max-new-tokens"),
])
def test_generate_bad_input_names_the_field(exported, capsys, args, field):
    capsys.readouterr()
    assert main(["generate", str(exported), "--device", "cpu", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"error: {field}" in err[0]


def test_generate_compare_prints_and_writes_both_sides(exported, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    capsys.readouterr()
    js = tmp_path / "cmp.json"
    rc = main(["generate", str(exported), "--prompt", "the cat sat on", "--prompt", "a dog ran", "--max-new-tokens", "5",
               "--device", "cpu", "--compare", "--json", str(js)])
    io = capsys.readouterr()
    assert rc == 0, io.err
    assert "on cpu (float32, eager, no CUDA graphs)" in io.out and "untimed warm-up" in io.out
    for side in ("dense", "routed"):
        assert re.search(rf"^{side}: +[0-9.]+ tokens/s \(10 tokens in ", io.out, re.M), io.out
    assert re.search(r"^routed/dense: [0-9.]+x; skipped attn .*kinds averaged.* of routed weights$", io.out, re.M)
    assert re.search(r"^greedy tokens agree \d+/10 \(\d of 2 prompt\(s\) identical\)$", io.out, re.M)
    assert io.out.count("tokens/s, routed ") == 2 and "### a dog ran" in io.out
    got = json.loads(js.read_text())
    assert got["device"] == "cpu" and got["dtype"] == "float32" and got["graphs"] is False
    assert set(got["total"]) >= {"dense_tokens_per_s", "routed_tokens_per_s", "ratio", "skipped", "matching"}
    tok = AutoTokenizer.from_pretrained(exported)
    plain = AutoModelForCausalLM.from_pretrained(exported).eval()  # the folder's backbone, never routed
    routed = wide.load(exported)
    for rec in got["records"]:
        d, r = rec["dense"], rec["routed"]
        assert d["new_tokens"] == r["new_tokens"] == 5 and d["tokens_per_s"] > 0 and r["tokens_per_s"] > 0
        ids = torch.tensor([tok(rec["prompt"])["input_ids"]])
        assert d["tokens"][0] == wide.generate(plain, ids, max_new_tokens=5)[0, ids.shape[1]:].tolist()
        assert r["tokens"][0] == wide.generate(routed, ids, max_new_tokens=5)[0, ids.shape[1]:].tolist()
        assert rec["ratio"] == pytest.approx(r["tokens_per_s"] / d["tokens_per_s"])
        assert set(rec["skipped"]) == {"attn", "ffn", "total", "by_weight"} and 0 < rec["skipped"]["by_weight"] < 1
        assert isinstance(r["completion"], str) and isinstance(d["completion"], str)
        assert 0 <= rec["matching"] <= 5 and (rec["first_divergence"] is None) == (rec["matching"] == 5)


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "eager"])
def test_generate_on_cuda_with_graphs_gives_the_cpu_completions(exported, tmp_path, capsys, graphs):
    """fp32 `wide generate` on CUDA (Triton kernels, graphs or eager) against CPU (the torch reference): every CUDA
    token is the CPU model's greedy choice on the CUDA tokens before it, up to a near-tie of the logits. (A random tiny
    model has near-ties: "a dog"'s third token wins by 9e-5 on CPU, so on 2026-12-03 exact token equality failed
    there on the H200 while `tl.dot` rounded fp32 operands to TF32, before `tiles.mma`.)"""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    got = {}
    prompts = ["the cat sat on the mat and", "a dog", "the cat sat on the mat and"]
    for dev in ("cpu", "cuda"):
        js = tmp_path / f"{dev}.json"
        argv = ["generate", str(exported), *[a for p in prompts for a in ("--prompt", p)], "--max-new-tokens", "12",
                "--device", dev, "--dtype", "float32", "--json", str(js)] + ([] if graphs or dev == "cpu" else
                                                                              ["--no-graphs"])
        assert main(argv) == 0, capsys.readouterr().err
        got[dev] = json.loads(js.read_text())["records"]
    assert got["cuda"][0]["tokens"] == got["cuda"][2]["tokens"]  # graphs replayed for a repeated prompt
    cpu = wide.load(exported, dtype=torch.float32, device="cpu")
    tok = __import__("transformers").AutoTokenizer.from_pretrained(exported)
    for rec, ref in zip(got["cuda"], got["cpu"]):
        ids = tok(rec["prompt"])["input_ids"]
        with torch.no_grad():
            logits = cpu(torch.tensor([ids + rec["tokens"]])).logits[0, len(ids) - 1:-1]
        chosen = logits.gather(-1, torch.tensor(rec["tokens"]).view(-1, 1))[:, 0]
        assert (logits.max(-1).values - chosen).max() <= 1e-3, (rec["prompt"], rec["tokens"], ref["tokens"])
        assert rec["skipped"]["by_weight"] == pytest.approx(ref["skipped"]["by_weight"], abs=0.02)


def test_generate_needs_an_exported_folder(tiny_model_dir, capsys):
    assert main(["generate", tiny_model_dir, "--prompt", "x"]) == 2
    assert "routers.safetensors" in capsys.readouterr().err


@pytest.mark.slow
def test_export_and_generate_smollm2_from_the_command_line(tmp_path, capsys):
    """The real default model: a routed checkpoint exported and continued from the command line (CPU)."""
    from transformers import AutoModelForCausalLM

    from wide.assets import resolve_model

    path = str(resolve_model("smollm2-135m"))
    cfg = wide.WideConfig(sparsity=0.5, router="lowrank", attn_group_size=3, ffn_group_size=64)
    model = wide.apply_wide(AutoModelForCausalLM.from_pretrained(path), cfg)
    ckpt = save_trained(model, tmp_path / "routers.safetensors", config=cfg, stage="calibrate", step=0,
                        extra={"model": "smollm2-135m"})
    out = tmp_path / "smollm2-wide"
    assert main(["export", "--checkpoint", str(ckpt), "--out", str(out)]) == 0
    js = tmp_path / "gen.json"
    rc = main(["generate", str(out), "--chat", "--prompt", "What is the capital of France?", "--max-new-tokens", "12",
               "--device", "cpu", "--json", str(js)])
    assert rc == 0, capsys.readouterr().err
    rec = json.loads(js.read_text())["records"][0]
    assert rec["new_tokens"] >= 1 and rec["completion"].strip()
    assert 0.3 < rec["skipped"]["by_weight"] < 0.7
