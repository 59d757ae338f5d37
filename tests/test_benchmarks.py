"""The scripts under ``benchmarks/`` on any machine: each imports and parses its flags, the shared setup module
(``benchmarks/common.py``) works, the config sweeps build their candidates, and the CPU-runnable scripts run on a
tiny shape. A script broken by a change in ``wide`` fails here, on CPU CI, not after device minutes are spent."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPTS = sorted(p.stem for p in BENCH.glob("*.py") if p.stem != "common")
HELPERS = {"device_assets"}  # gpu_session.sh's chunk reassembly, not a benchmark: no timing, no common flags


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_maintained_scripts_are_the_ones_listed():
    """A new script gets a line in BENCHMARKS.md's "How to run" and a case here; a removed one leaves both."""
    assert SCRIPTS == sorted([
        "batched_topk", "calibration_throughput", "decode_attention_sweep", "device_assets", "experts", "fsdp_check", "gemv_sweep",
        "generate_speed", "generator_ttft", "kernels", "prefill_gemm_sweep", "profile_decode", "profile_host",
        "profile_model", "profile_prefill"])
    assert not list((BENCH / "results").rglob("*.py")) and not list((BENCH / "results").rglob("*.sh"))


@pytest.mark.parametrize("name", SCRIPTS)
def test_script_imports_and_prints_its_help(name, capsys):
    mod = _load(name)
    with pytest.raises(SystemExit) as exc:
        mod.main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage:")
    if name not in HELPERS:  # every benchmark takes its setup from the one shared module
        assert "from benchmarks import common" in (BENCH / f"{name}.py").read_text()


@pytest.mark.parametrize("name", [s for s in SCRIPTS if s not in HELPERS | {"fsdp_check"}])
def test_a_cuda_script_on_a_cpu_machine_says_so_before_any_compute(name, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    argv = {"profile_model": ["--model", "x"]}.get(name, [])
    if name == "calibration_throughput":
        argv = ["--device", "cuda"]
    with pytest.raises(SystemExit) as exc:
        _load(name).main(argv)
    assert "cuda" in str(exc.value).lower()


def test_kernel_switches_are_kernel_options_not_environment_variables():
    for path in [*BENCH.glob("*.py"), BENCH / "gpu_session.sh"]:
        text = path.read_text()
        for env in ("WIDE_PERSISTENT_MN", "WIDE_SKINNY_SWAP", "WIDE_DECODE_FOLD", "AB_ENV"):
            assert env not in text, f"{path.name} still names {env}: use --kernel-option"
    with pytest.raises(SystemExit, match="--kernel-option: unknown kernel option 'skinny'"):
        _load("kernels").main(["--kernel-option", "skinny=0"])
    with pytest.raises(SystemExit, match="--ops takes"):
        _load("kernels").main(["--ops", "gemm"])


def test_gpu_session_script_parses():
    assert subprocess.run(["bash", "-n", str(BENCH / "gpu_session.sh")]).returncode == 0


# --------------------------------------------------------------------------------------------------
# the shared module
# --------------------------------------------------------------------------------------------------


def _common():
    sys.path.insert(0, str(BENCH.parent))
    from benchmarks import common

    return common


def test_common_flags_and_their_errors(monkeypatch):
    c = _common()
    ap = c.parser("doc", shape="llama-8b", layers=8, kernel_options=True)
    args = ap.parse_args(["--device", "cpu", "--dtype", "fp32", "--kernel-option", "decode_fold=0"])
    assert (args.shape, args.layers, args.json, args.md) == ("llama-8b", 8, None, None)
    assert c.setup(args) == (torch.device("cpu"), torch.float32)
    assert c.kernel_options_of(args).changed() == {"decode_fold": False}
    with pytest.raises(SystemExit, match="--layers must be at least 1"):
        c.setup(ap.parse_args(["--device", "cpu", "--layers", "0"]))
    with pytest.raises(SystemExit, match="--device must be cuda or cpu"):
        c.setup(ap.parse_args(["--device", "mps"]))
    with pytest.raises(SystemExit, match="NAME=0 or NAME=1"):
        c.setup(ap.parse_args(["--device", "cpu", "--kernel-option", "decode_fold"]))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="--device cuda, but this machine has no CUDA GPU"):
        c.setup(ap.parse_args([]))
    routing = c.parser("doc")
    c.add_routing_args(routing)
    with pytest.raises(SystemExit, match="--sparsity must be in"):
        c.check_routing_args(routing.parse_args(["--sparsity", "1.0"]))


def test_shape_presets_match_their_models():
    from wide.bench.models import LLAMA_8B

    c = _common()
    cfg = c.shape_config("llama-8b", layers=2)
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers) == (4096, 14336, 2)
    assert cfg.vocab_size == LLAMA_8B["vocab_size"] and cfg._attn_implementation == "sdpa"
    qwen = c.shape_config("qwen2.5-1.5b")
    assert type(qwen).__name__ == "Qwen2Config" and (qwen.hidden_size, qwen.num_key_value_heads) == (1536, 2)


def test_route_gives_the_bench_routed_side_on_a_tiny_model():
    import wide

    c = _common()
    torch.manual_seed(0)
    model = c.random_model("tiny", None, "cpu", torch.float32)
    ids = torch.randint(0, 100, (1, 12))
    with torch.no_grad():
        dense = model(ids).logits
    c.route(model, 0.5, "random")
    layers = wide.modeling.runtime_of(model).layers
    assert layers and all(r.rate == 0.5 for wl in layers for r in wl.routers.values())
    with torch.no_grad():
        routed = model(ids).logits
    assert routed.shape == dense.shape and not torch.equal(routed, dense)


def test_timers_and_report_on_cpu(tmp_path, capsys):
    c = _common()
    assert c.wall_ms(lambda: sum(range(100)), reps=3) >= 0
    assert c.event_ms(lambda: sum(range(100)), iters=3) >= 0
    assert c.rel_err(torch.ones(4), torch.ones(4)) == 0
    args = c.parser("doc").parse_args(["--json", str(tmp_path / "r.json"), "--md", str(tmp_path / "r.md")])
    c.report(args, {"rows": [{"a": 1}]}, "| a |\n|---|\n| 1 |", "cpu")
    got = json.loads((tmp_path / "r.json").read_text())
    assert got["rows"] == [{"a": 1}]
    assert {"date", "gpu", "commit", "command", "torch"} <= set(got["meta"]) and got["meta"]["gpu"] == "cpu"
    md = (tmp_path / "r.md").read_text()
    assert md.startswith("_") and "commit `" in md and md.endswith("| 1 |\n")
    assert "| 1 |" in capsys.readouterr().out
    results = []
    c.time_candidate(results, "ok", lambda: (torch.ones(2), torch.ones(2), lambda: 3.0))
    c.time_candidate(results, "bad", lambda: 1 / 0)
    assert results[0] == (3.0, "ok", "0.0e+00") and results[1][0] == float("inf")


# --------------------------------------------------------------------------------------------------
# config sweeps and scripts' own pieces
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("op", ["gemm_mn", "swiglu"])
def test_prefill_gemm_sweep_candidates(op, wide):
    from wide.kernels.triton.common import GemmConfig

    cands = _load("prefill_gemm_sweep").candidates(op, wide)
    assert cands[0] is None and len(cands) > 2
    for kind, cfg in cands[1:]:
        assert kind == "perm" and isinstance(cfg, GemmConfig)


def test_gemv_sweep_candidates():
    mod = _load("gemv_sweep")
    for table in (mod.CANDIDATES, mod.CANDIDATES_16):
        assert set(table) == {"gemm_k", "gemm_mn", "swiglu"}
        assert all(len(v) > 1 and v[0] is None for v in table.values())


def test_decode_attention_sweep_candidates():
    from wide.kernels.triton.attention import AttentionConfig

    mod = _load("decode_attention_sweep")
    for table in (mod.CANDIDATES, mod.QUICK, mod.FOLD):
        assert table[0] is None and all(isinstance(c, AttentionConfig) for c in table[1:])


def test_profile_host_timers_count_only_while_on():
    ph = _load("profile_host")
    timers = ph.Timers()

    class Owner:
        @staticmethod
        def layer():
            Owner.inner()

        @staticmethod
        def inner():
            return 1

    timers.patch(Owner, "layer", "A layer")
    timers.patch(Owner, "inner", "B inner")
    Owner.layer()  # off: not counted
    timers.on = True
    Owner.layer()
    Owner.layer()
    assert timers.calls == {"A layer": 2, "B inner": 2}
    rows = timers.table("A layer")
    assert len(rows) == 2 and "1.00 calls/layer  B inner" in rows[1]


def test_profile_prefill_groups_kernel_names():
    family = _load("profile_prefill").family
    assert family("_gemm_k_split_kernel") == "routed gemm_k"
    assert family("sm90_xmma_gemm_bf16 nvjet") == "cuBLAS GEMM"
    assert family("triton_poi_fused_mul_0") == "elementwise / other"


def test_device_assets_reassembles_wheels_from_chunks(tmp_path):
    a, b = b"A" * 70, b"B" * 50
    stream = a + b
    up = tmp_path / "up"
    up.mkdir()
    (up / "manifest.txt").write_text("a.whl 70\nb.whl 50\n")
    for i in range(2):  # 80 of 120 bytes arrived: a.whl is whole, b.whl is not
        (up / f"chunk_{i:02d}").write_bytes(stream[40 * i:40 * i + 40])
    _load("device_assets").main(["--chunks", str(up), "--dest", str(tmp_path / "w")])
    assert (tmp_path / "w" / "a.whl").read_bytes() == a and not (tmp_path / "w" / "b.whl").exists()
    (up / "chunk_02").write_bytes(stream[80:])
    _load("device_assets").main(["--chunks", str(up), "--dest", str(tmp_path / "w")])
    assert (tmp_path / "w" / "b.whl").read_bytes() == b
    with pytest.raises(SystemExit, match="no manifest.txt"):
        _load("device_assets").main(["--chunks", str(tmp_path), "--dest", str(tmp_path / "w")])


# --------------------------------------------------------------------------------------------------
# CPU runs on tiny shapes
# --------------------------------------------------------------------------------------------------


def test_generator_ttft_measures_both_paths_on_a_tiny_model():
    from tests.conftest import tiny_model

    mod = _load("generator_ttft")
    model = tiny_model("llama").eval()
    prompts = {t: torch.randint(3, 96, (1, t)) for t in (5, 200)}
    got = mod.measure(model, prompts, new=4, reps=1, max_cache_len=256)
    assert got[5]["plan"] == [128] and got[200]["plan"] == [256]  # default sizes up to the cache length
    assert all(v > 0 for row in got.values() for k, v in row.items() if k != "plan")


def test_calibration_throughput_runs_on_a_tiny_shape(tmp_path):
    out = tmp_path / "ct.json"
    _load("calibration_throughput").main(["--device", "cpu", "--shape", "tiny", "--batch-size", "2", "--seq-len", "16",
                                          "--paths", "torch", "--kd", "0", "--warmup", "0", "--iters", "1",
                                          "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 1 and rows[0]["path"] == "torch" and rows[0]["tokens_per_s"] > 0


def test_kernels_table_runs_through_the_triton_interpreter(tmp_path):
    out = tmp_path / "k.json"
    proc = subprocess.run([sys.executable, str(BENCH / "kernels.py"), "--smoke", "--ops", "coherent_select",
                           "--kernel-option", "decode_fold=0", "--json", str(out)],
                          capture_output=True, text=True, cwd=BENCH.parent, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(out.read_text())
    assert got["meta"]["kernel_options"] == {"decode_fold": False}
    assert got["rows"] and all(r["op"] == "coherent_select" and r["err"] == 0 for r in got["rows"])
