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
# gpu_session.sh's chunk reassembly and its runner of a command under swept configs: no timing, no common flags
HELPERS = {"device_assets", "with_configs"}
REPORTS = {"frontier"}  # join results already measured (no device): they run on any machine


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_maintained_scripts_are_the_ones_listed():
    """A new script gets a line in BENCHMARKS.md's "How to run" and a case here; a removed one leaves both."""
    assert SCRIPTS == sorted([
        "batched_topk", "calibration_throughput", "decode_attention_sweep", "decode_qkv_sweep", "decode_rates",
        "device_assets", "experts", "frontier",
        "fsdp_check", "gemv_sweep", "generate_batching", "generate_speed", "generator_ttft", "kernel_table",
        "prefill_attention_sweep", "prefill_gemm_sweep",
        "profile_decode", "profile_host", "profile_model", "profile_prefill", "with_configs"])
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


@pytest.mark.parametrize("name", [s for s in SCRIPTS if s not in HELPERS | REPORTS | {"fsdp_check"}])
def test_a_cuda_script_on_a_cpu_machine_says_so_before_any_compute(name, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    argv = {"profile_model": ["--model", "x"], "decode_rates": ["--model", "x", "--checkpoint", "y"]}.get(name, [])
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
        _load("kernel_table").main(["--kernel-option", "skinny=0"])
    with pytest.raises(SystemExit, match="--ops takes"):
        _load("kernel_table").main(["--ops", "gemm"])


def test_gpu_session_script_parses():
    assert subprocess.run(["bash", "-n", str(BENCH / "gpu_session.sh")]).returncode == 0


def _session_functions(*names: str) -> str:
    """The shell functions ``names`` of gpu_session.sh, as text to source."""
    lines, out, keep = (BENCH / "gpu_session.sh").read_text().splitlines(), [], False
    for line in lines:
        keep = keep or any(line.startswith(f"{n}() {{") for n in names)
        if keep:
            out.append(line)
            keep = not line.endswith(("done; }", "esac; }"))
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("fit", ["fits/calibrate-0123abcd", "cells/method=joint__stage=lora/lora"])
def test_gpu_session_resume_round_trip(tmp_path, fit):
    """A lost machine's fit comes back: ``ship_resume`` cuts the newest last.ckpt of a grid (a stage-1 fit or a
    stage-2-only cell such as the joint one) into parts with plain names, ``restore_resume`` puts it back under the
    grid folder at the same relative path, byte for byte; a second poll ships nothing new."""
    src = tmp_path / "tree_x" / "runs" / "quality" / "qjoint" / fit
    src.mkdir(parents=True)
    (src / "started.json").write_text('{"signature": "s"}')
    (src / "last.ckpt").write_bytes(bytes(range(256)) * 70_000)  # 17.9 MB: two parts
    out = tmp_path / "out"
    out.mkdir()
    script = _session_functions("ship_resume", "restore_resume") + f"""
set -e
export RESUME_ROOT={tmp_path} OUT={out} SHIP_RESUME="qlong qjoint"
ship_resume
mkdir -p {tmp_path}/resume && cp {out}/* {tmp_path}/resume/ && rm {out}/*
restore_resume {tmp_path}/back
ship_resume
"""
    run = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "restored" in run.stdout and "bad sum" not in run.stdout
    parts = sorted(p.name for p in (tmp_path / "resume").iterdir() if p.suffix != ".tar")  # .tar: restore's own
    assert len(parts) == 3 and all("=" not in p and "/" not in p for p in parts), parts
    back = tmp_path / "back" / fit
    assert (back / "last.ckpt").read_bytes() == (src / "last.ckpt").read_bytes()
    assert (back / "started.json").read_text() == '{"signature": "s"}'
    assert not list(out.iterdir())  # nothing newer to ship on the second poll


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


def test_prefill_gemm_sweep_layer_shapes():
    mod = _load("prefill_gemm_sweep")
    # the 8B shape's rows as the sweep has always timed them (q: groups of 4 heads of 128)
    assert mod.layer_shapes("llama-8b") == {"q_proj": ("gemm_mn", 4096, 4096, 512),
                                            "gate_up": ("swiglu", 14336, 4096, 128),
                                            "up_proj": ("gemm_mn", 14336, 4096, 128)}
    assert mod.layer_shapes("qwen2.5-1.5b")["q_proj"] == ("gemm_mn", 1536, 1536, 768)  # 12 q / 2 kv heads of 128
    assert mod.layer_shapes("smollm2-135m")["gate_up"] == ("swiglu", 1536, 576, 128)
    assert mod.layer_shapes("smollm2-135m")["q_proj"] == ("gemm_mn", 576, 576, 192)  # 9 q / 3 kv heads of 64
    with pytest.raises(SystemExit, match="--ops takes q_proj, gate_up, up_proj"):
        mod.main(["--shape", "smollm2-135m", "--ops", "o_proj"])


@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("model", ["llama-8b", "qwen2.5-1.5b", "smollm2-135m"])
@pytest.mark.parametrize("shape", ["q_proj", "gate_up", "up_proj"])
def test_prefill_gemm_sweep_candidates(model, shape, wide):
    from wide.kernels.triton.common import GemmConfig

    mod = _load("prefill_gemm_sweep")
    op, N, K, group = mod.layer_shapes(model)[shape]
    cands = mod.candidates(op, group, wide, narrow=K <= 2048)
    assert cands[0] is None and len(cands) > 2
    assert len(set(cands)) == len(cands)
    for kind, cfg in cands[1:]:
        assert kind == "perm" and isinstance(cfg, GemmConfig)
        assert group % cfg.block_n == 0, f"{model} {shape}: a tile that splits a group ({cfg})"
    if K <= 2048:  # narrow models get the smaller tiles and fewer warps
        assert any(cfg.num_warps == 4 and cfg.block_m == 64 for _, cfg in cands[1:])


def test_gemv_sweep_candidates():
    mod = _load("gemv_sweep")
    for table in (mod.CANDIDATES, mod.CANDIDATES_16):
        assert set(table) == {"gemm_k", "gemm_mn", "swiglu"}
        assert all(len(v) > 1 and v[0] is None for v in table.values())


def test_decode_qkv_sweep_candidates():
    mod = _load("decode_qkv_sweep")
    assert mod.CONFIGS[0] is None and len(mod.CONFIGS) > 2
    for sp, bk, w, *stages in mod.CONFIGS[1:]:  # (split, block_k, warps[, num_stages])
        assert sp >= 1 and bk & (bk - 1) == 0 and w in (2, 4, 8) and all(1 <= st <= 6 for st in stages)
        assert len(stages) <= 1
    assert len(set(mod.CONFIGS[1:])) == len(mod.CONFIGS) - 1
    assert set(mod.SHAPES) == {"llama-8b", "qwen2.5-1.5b", "smollm2-135m"}


def test_decode_attention_sweep_candidates():
    from wide.kernels.triton.attention import AttentionConfig

    mod = _load("decode_attention_sweep")
    for table in (mod.CANDIDATES, mod.QUICK, mod.FOLD):
        assert table[0] is None and all(isinstance(c, AttentionConfig) for c in table[1:])


def test_prefill_attention_sweep_candidates():
    from wide.kernels.triton.attention import AttentionConfig

    mod = _load("prefill_attention_sweep")
    assert mod.CANDIDATES[0] is None and len(mod.CANDIDATES) == 37
    assert all(isinstance(c, AttentionConfig) for c in mod.CANDIDATES[1:])
    assert mod.candidates(False) == mod.CANDIDATES
    packed = mod.candidates(True)
    assert len(packed) == 73 and len(set(packed[1:])) == 72 and sum(c.pack for c in packed[1:]) == 36
    with pytest.raises(SystemExit, match="--hq"):
        mod.main(["--hq", "9", "--hk", "2"])


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
                                          "--fuse-glue", "0,1", "--glue-backend", "aot_eager", "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [r["glue"] for r in rows] == ["eager", "compiled"]
    assert all(r["path"] == "torch" and r["tokens_per_s"] > 0 for r in rows)


def test_calibration_throughput_times_stage_two_with_its_adapter(tmp_path, capsys):
    out = tmp_path / "ct.json"
    _load("calibration_throughput").main(["--device", "cpu", "--shape", "tiny", "--batch-size", "2", "--seq-len", "16",
                                          "--paths", "torch", "--kd", "1", "--warmup", "0", "--iters", "1",
                                          "--stage", "lora", "--json", str(out)])
    assert "stage lora" in capsys.readouterr().out
    assert json.loads(out.read_text())["rows"][0]["tokens_per_s"] > 0


def test_generate_batching_runs_on_a_tiny_shape(tmp_path):
    out = tmp_path / "gb.json"
    _load("generate_batching").main(["--device", "cpu", "--dtype", "fp32", "--shape", "tiny", "--prompts", "6",
                                     "--min-len", "2", "--max-len", "9", "--max-new-tokens", "4", "--batch-size", "4",
                                     "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [r["length_spread"] for r in rows] == [0, 32]
    assert all(r["identical_to_first"] == 6 and r["generated_tokens"] == 24 for r in rows)  # fp32: same answers


def test_kernels_table_runs_through_the_triton_interpreter(tmp_path):
    out = tmp_path / "k.json"
    proc = subprocess.run([sys.executable, str(BENCH / "kernel_table.py"), "--smoke", "--ops", "coherent_select",
                           "--kernel-option", "decode_fold=0", "--json", str(out)],
                          capture_output=True, text=True, cwd=BENCH.parent, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(out.read_text())
    assert got["meta"]["kernel_options"] == {"decode_fold": False}
    assert got["rows"] and all(r["op"] == "coherent_select" and r["err"] == 0 for r in got["rows"])


# --------------------------------------------------------------------------------------------------
# the frontier report (grid results + bench rows, both fabricated here)
# --------------------------------------------------------------------------------------------------


def _frontier_cell(method, target, by_weight, kinds, ppl, avg, dense=False, measure="weight"):
    """A finished cell's result.json as `wide.grid.runner` writes it (the fields the report reads)."""
    sparsity = {"sparsity": 0.0, "by_kind": {}} if dense else {"sparsity": kinds, "by_weight": by_weight,
                                                                "by_kind": {"attn": kinds, "ffn": kinds}}
    return {"format": "wide-grid/1", "cell": f"method={method}__target={target}", "status": "done",
            "labels": {"method": method, "target": str(target)},
            "routing": None if dense else {"sparsity": target, "sparsity_measure": measure, "granularity": "width"},
            "summary": {"method": "dense" if dense else "width/lowrank", "target_sparsity": 0.0 if dense else target,
                        "ppl": ppl, "avg": avg, "sparsity": sparsity}}


FRONTIER_CELLS = [  # grid order: dense twice (one model, copied), then methods x targets, one pending
    _frontier_cell("dense", 0.25, None, None, 20.0, 0.40, dense=True),
    _frontier_cell("dense", 0.5, None, None, 20.0, 0.40, dense=True),
    _frontier_cell("wide", 0.5, 0.52, 0.55, 40.0, 0.36),
    _frontier_cell("wide", 0.25, 0.375, 0.30, 30.0, 0.38),
    _frontier_cell("depth", 0.25, 0.63, 0.63, 900.0, 0.30),   # past the bench's 0.6 by 0.03: extrapolated
    _frontier_cell("depth", 0.5, 0.80, 0.80, 5000.0, 0.28),   # 0.2 past it: no speed
    _frontier_cell("static", 0.5, 0.50, 0.50, 800.0, 0.33, measure="kinds"),
]

FRONTIER_BENCH = {"device": "NVIDIA H200", "torch": "2.11.0",
                  "args": {"router": "random", "ffn_group_size": 128, "fuse_glue": "inductor", "context": 4096},
                  "rows": [
                      *[{"phase": "decode", "batch": 1, "tokens": 4096, "sparsity": s, "realized": s,
                         "realized_by_weight": bw, "routing": "per-token", "ratio": ratio, "mode": "graph"}
                        for s, bw, ratio in [(0.0, 0.0, 0.95), (0.25, 0.25, 1.2), (0.5, 0.5, 1.6), (0.6, 0.6, 1.9)]],
                      {"phase": "decode", "batch": 1, "tokens": 4096, "sparsity": 0.5, "realized_by_weight": 0.5,
                       "routing": "coherent", "ratio": 9.0, "mode": "graph"},   # not per-token: left out
                      {"phase": "decode", "batch": 16, "tokens": 4096, "sparsity": 0.5, "realized_by_weight": 0.5,
                       "routing": "per-token", "ratio": 9.0, "mode": "graph"},  # another batch: left out
                      *[{"phase": "prefill", "batch": 1, "tokens": 4096, "sparsity": s, "realized_by_weight": s,
                         "routing": "per-token", "ratio": ratio, "mode": mode}
                        for s in (0.0, 0.25, 0.5, 0.6) for mode, ratio in (("eager", 5.0), ("graph", 1.0 + s))],
                      {"phase": "prefill", "batch": 1, "tokens": 1024, "sparsity": 0.5, "realized_by_weight": 0.5,
                       "routing": "per-token", "ratio": 9.0, "mode": "graph"},  # another length: left out
                  ]}


def _frontier_grid(folder: Path) -> Path:
    cells = [c["cell"] for c in FRONTIER_CELLS] + ["method=static__target=0.25"]
    (folder / "grid.json").parent.mkdir(parents=True, exist_ok=True)
    (folder / "grid.json").write_text(json.dumps({"cells": cells}))
    for cell in FRONTIER_CELLS:
        (folder / "cells" / cell["cell"]).mkdir(parents=True)
        (folder / "cells" / cell["cell"] / "result.json").write_text(json.dumps(cell))
    (folder / "cells" / "method=static__target=0.25").mkdir()  # pending: no result.json yet
    return folder


def test_frontier_joins_grid_cells_with_bench_speed_at_the_realized_rate(tmp_path, capsys):
    grid = _frontier_grid(tmp_path / "grid")
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(FRONTIER_BENCH))
    out = tmp_path / "frontier.json"
    _load("frontier").main([str(grid), "--bench", str(bench), "--json", str(out)])
    got = json.loads(out.read_text())
    assert {"date", "commit", "command"} <= set(got["meta"])
    rows = {(r["method"], r["target"]): r for r in got["rows"]}
    assert [r["method"] for r in got["rows"]] == ["dense", "wide", "wide", "depth", "depth", "static"]  # dense once
    dense, wide25, wide50 = rows[("dense", 0.0)], rows[("wide", 0.25)], rows[("wide", 0.5)]
    assert (dense["decode"], dense["prefill"], dense["of_dense"]) == (1.0, 1.0, 1.0)
    assert wide25["decode"] == pytest.approx(1.4)  # realized 0.375 by weight: half-way from 1.2 (0.25) to 1.6 (0.5)
    assert wide25["prefill"] == pytest.approx(1.375)  # the graph rows (1 + rate), not the eager ones
    assert wide50["decode"] == pytest.approx(1.66) and wide50["of_dense"] == pytest.approx(0.9)  # at 0.52, not 0.5
    depth25, depth50 = rows[("depth", 0.25)], rows[("depth", 0.5)]
    assert depth25["decode"] == pytest.approx(1.99) and depth25["decode_extrapolated"]
    assert depth50["decode"] is None and depth50["prefill"] is None
    md = (grid / "frontier.md").read_text()
    assert md.startswith("_") and "| wide | 25.0 | 37.5 | 30.0 | 30.00 | 38.0 | 95.0 | 1.40x | 1.38x |" in md
    assert "| dense | – | 0.0 | 0.0 | 20.00 | 40.0 | 100.0 | 1.00x | 1.00x |" in md
    assert "1.99x†" in md and "| static | 50.0 (kinds) |" in md and "realized by-weight" in md
    assert (grid / "plots" / "frontier.png").stat().st_size > 1000
    assert "| depth | 50.0 | 80.0 | 80.0 | 5000.00 | 28.0 | 70.0 | – | – |" in capsys.readouterr().out

    csv_only = tmp_path / "csv"  # a grid brought back without its cells/: results.csv (with the by-weight column)
    csv_only.mkdir()
    (csv_only / "results.csv").write_text(
        "cell,method,status,routing,target_sparsity,realized_sparsity,realized_by_weight,ppl,avg\n"
        "method=dense,dense,done,dense,0.0,0.0,,20.0,0.4\n"
        "method=wide,wide,done,width/lowrank,0.5,0.55,0.52,40.0,0.36\n"
        "method=depth,depth,failed,,,,,,\n")
    _load("frontier").main([str(csv_only), "--bench", str(bench), "--md", str(tmp_path / "f.md"),
                            "--plot", str(tmp_path / "f.png")])
    md = (tmp_path / "f.md").read_text()
    assert "| wide | 50.0 (?) | 52.0 | 55.0 | 40.00 | 36.0 | 90.0 | 1.66x | 1.52x |" in md and "| depth |" not in md

    with pytest.raises(SystemExit, match="--decode-batch 4: .*batches: \\[1, 16\\]"):
        _load("frontier").main([str(grid), "--bench", str(bench), "--decode-batch", "4"])
    with pytest.raises(SystemExit, match="--prefill-mode 'chunks'"):
        _load("frontier").main([str(grid), "--bench", str(bench), "--prefill-mode", "chunks"])
    with pytest.raises(SystemExit, match="neither cells"):
        _load("frontier").main([str(tmp_path), "--bench", str(bench)])


def test_decode_rates_runs_on_cpu_and_the_runner_matches_prefill(tiny_model_dir, tiny_corpus, tmp_path):
    """benchmarks/decode_rates.py on a tiny model folder with untrained routers: the bench's decode runner routes its
    tokens exactly as one prefill forward does."""
    import wide
    from wide.io.checkpoint import save_trained
    from wide.io.loading import pretrained_lm

    model = pretrained_lm(tiny_model_dir)
    cfg = wide.WideConfig(sparsity=0.5, attn_group_size=2, ffn_group_size=32)
    wide.apply_wide(model, cfg)
    ck = tmp_path / "routers.safetensors"
    save_trained(model, ck, config=cfg, stage="calibrate")
    out = tmp_path / "rates.json"
    _load("decode_rates").main(["--model", tiny_model_dir, "--checkpoint", str(ck), "--device", "cpu",
                                "--dtype", "fp32", "--context", "24", "--tokens", "6", "--offset", "3",
                                "--text-source", tiny_corpus, "--json", str(out)])
    res = json.loads(out.read_text())
    assert len(res["runner"]) == len(res["prefill"]) == len(res["holes"]) == 6
    assert max(abs(a - b) for a, b in zip(res["runner"], res["prefill"])) < 1e-6
    assert res["meta"]["command"]


SIDES = {"0": "decode_route=0", "1": "decode_route=1", "f": "decode_route=1 decode_route_attn=0",
         "w": "decode_route=1 route_warm=1", "fw": "decode_route=1 decode_route_attn=0 route_warm=1"}


def test_gpu_session_route_ab_runs_every_side_into_its_folder(tmp_path):
    """``route_ab DIR TIMEOUT`` (table23 and route23q): one bench per side of ``decode_route`` (`route_side`: off, on,
    on for the FFN side only, with the warm tail, both), its table under DIR (``--json`` beside it), its decode rows
    (or an error) echoed; ``ROUTE_SIDES`` picks sides."""
    stub = tmp_path / "wide.sh"  # stands in for `python3 -m wide.cli`: echoes its kernel options as a decode row
    stub.write_text('r=""; for a in "$@"; do case $a in *=*) r="$r $a";; esac; done; echo "| decode |$r"\n')
    script = _session_functions("route_side", "route_ab") + f"""
W="bash {stub}"
route_ab {tmp_path} 20
ROUTE_SIDES="0 w" route_ab {tmp_path}/two 20
"""
    (tmp_path / "two").mkdir()
    run = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    rows = [f"| decode | {o}" for o in SIDES.values()]
    assert run.stdout.splitlines() == rows + [rows[0], rows[3]]
    for v, o in SIDES.items():
        assert (tmp_path / f"bench8b_route{v}.md").read_text() == f"| decode | {o}\n"
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == ["bench8b_route0.md", "bench8b_routew.md"]


def test_gpu_session_route_profiles_name_each_shape_and_side(tmp_path):
    """``route_profiles DIR TIMEOUT``: a profile per shape and side, each under DIR with the options it ran with."""
    fake = tmp_path / "benchmarks"
    fake.mkdir()
    (fake / "profile_decode.py").write_text("import sys; print('wall', ' '.join(sys.argv[1:]))\n")
    script = _session_functions("route_side", "route_profiles") + f"""
cd {tmp_path}
route_profiles {tmp_path} 20
"""
    run = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert len(run.stdout.splitlines()) == 2 * len(SIDES)
    for shape in ("qwen2.5-1.5b", "llama-8b"):
        for v, o in SIDES.items():
            text = (tmp_path / f"profile_{shape}_route{v}.txt").read_text()
            assert f"--shape {shape} " in text
            assert text.split("--kernel-option", 1)[1].replace("--kernel-option", "").split() == o.split()
