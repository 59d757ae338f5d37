"""Stage-1 calibration (and, with ``--stage lora``, stage-2) throughput on a Qwen2.5-Coder-1.5B-shaped model with
random weights (no download).

Times the training step of ``RouterCalibration`` (routed forward, loss, backward into the routers, AdamW) under
bf16 autocast over a bf16 backbone, as ``wide fit --config recipes/qwen2.5-1.5b/calibrate.yaml`` (distillation) or ``calibrate_lm.yaml`` run it, for
each loss path:

- ``hf``: HF's own loss from full ``[B, T, V]`` logits (what `wide fit` ran before `wide.losses`);
- ``torch`` / ``liger``: the fused chunked linear loss of `wide.losses` (logits never whole);

each with the LM loss alone and with self-distillation (``--kd``: the dense teacher forward added), and with the
elementwise glue eager or compiled (``--fuse-glue 0,1``: `wide.fuse_glue`, what ``WideTask(fuse_glue=true)`` does:
RMS norms, RoPE, the routed MLP's ``silu(gate) ⊙ mask ⊙ up``). Prints tokens/s, achieved TFLOP/s and MFU
(`wide.callbacks.throughput`: formula and peak table) and peak memory per row.

    python benchmarks/calibration_throughput.py                       # 16 x 1024, all rows
    python benchmarks/calibration_throughput.py --paths torch,liger --micro-batch 4 --json out.json
    python benchmarks/calibration_throughput.py --device cpu --layers 1 --batch-size 2 --seq-len 32 \
        --paths torch --kd 0 --warmup 0 --iters 1                     # CPU smoke run
    python benchmarks/calibration_throughput.py --paths liger --fuse-glue 0,1   # eager vs compiled glue
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import common  # noqa: E402

PATHS = ("hf", "torch", "liger")


def add_lora(model, r: int = 16) -> None:
    """Stage 2's adapter as `LoRARecovery` adds it (peft LoRA of rank ``r`` on every projection, fp32, trainable)."""
    from wide.io.adapters import DEFAULT_LORA_ALPHA, inject_adapter, is_adapter_name, resolve_adapter
    from wide.tasks.lora import LORA_TARGETS

    settings = resolve_adapter("lora")().settings(r=r, alpha=DEFAULT_LORA_ALPHA, dropout=0.1, targets=LORA_TARGETS)
    inject_adapter(model, "lora", settings)
    for name, p in model.named_parameters():
        if is_adapter_name(name):
            p.data = p.data.float()
            p.requires_grad_(True)


def build(shape, layers, device, dtype):
    import wide

    model = common.random_model(shape, layers, device, dtype)
    model.config.use_cache = False
    heads = model.config.num_attention_heads // model.config.num_key_value_heads  # one group per kv head
    routing = wide.WideConfig(sparsity=0.5, attn_group_size=heads, ffn_group_size=128, router="lowrank", router_rank=32)
    return wide.apply_wide(model, routing).train()


def step_fn(model, path, kd, micro, batch, seq, device):
    """One optimizer step of ``batch`` rows as ``batch // micro`` accumulated micro-batches."""
    import wide
    from wide.losses import LossConfig, objective

    params = [p for p in model.parameters() if p.requires_grad]  # the routers (and stage 2's adapter)
    opt = torch.optim.AdamW(params, lr=2e-3, weight_decay=0.01)
    cfg = None if path == "hf" else LossConfig(lm=1.0, kd=1.0 if kd else 0.0, temperature=2.0, backend=path)
    runtime = wide.modeling.runtime_of(model)
    ids = torch.randint(0, min(32000, model.config.vocab_size), (batch, seq), device=device)
    state = {"i": 0}

    def run():
        opt.zero_grad(set_to_none=True)
        for s in range(0, batch, micro):
            rows = ids[s:s + micro]  # packed rows, as TextDataModule serves them
            chunk = {"input_ids": rows, "attention_mask": torch.ones_like(rows), "labels": rows}
            runtime.set_noise(state["i"])
            state["i"] += 1
            with torch.autocast(device.type, dtype=torch.bfloat16):
                if cfg is None:
                    loss = model(**chunk).loss
                else:
                    loss = objective(model, chunk, cfg).total
                stats = wide.sparsity_stats(model)
                loss = loss + 20.0 * (0.5 - stats.realized(differentiable=True)).abs()
            (loss * (micro / batch)).backward()
        opt.step()
        return loss.detach()

    return run


def measure(model, path, kd, micro, batch, seq, device, warmup, iters):
    from wide.callbacks.throughput import peak_tflops, train_flops_per_token

    run = step_fn(model, path, kd, micro, batch, seq, device)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    for _ in range(warmup):
        run()
    if cuda:
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        loss = run()
    if cuda:
        torch.cuda.synchronize(device)
    sec = (time.perf_counter() - t0) / iters
    tokens = batch * seq / sec
    flops = train_flops_per_token(model, seq, teacher=kd, teacher_head=kd) * tokens
    peak = peak_tflops(device, torch.bfloat16)
    return {"path": path, "kd": kd, "micro_batch": micro, "batch": batch, "seq_len": seq, "step_s": sec,
            "tokens_per_s": tokens, "tflops": flops / 1e12, "mfu": None if peak is None else flops / (peak * 1e12),
            "peak_mem_gib": torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None, "loss": float(loss)}


def main(argv=None):
    ap = common.parser(__doc__, shape="qwen2.5-1.5b", layers=True)
    ap.add_argument("--batch-size", type=int, default=16, help="rows per optimizer step")
    ap.add_argument("--micro-batch", type=int, default=None, help="rows per forward (default: the whole batch)")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--paths", default="hf,torch,liger", help="comma list of hf, torch, liger")
    ap.add_argument("--kd", default="0,1", help="comma list: 0 (LM loss only), 1 (with self-distillation)")
    ap.add_argument("--stage", choices=["calibrate", "lora"], default="calibrate",
                    help="calibrate: routers only (stage 1); lora: LoRA r=16 on every projection too (stage 2)")
    ap.add_argument("--fuse-glue", default="0", help="comma list: 0 (eager glue), 1 (compiled: wide.fuse_glue)")
    ap.add_argument("--glue-backend", default="inductor", help="torch.compile backend of --fuse-glue 1 "
                    "(aot_eager: the same graphs without generated code, for a CPU with no compiler)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args(argv)
    paths = args.paths.split(",")
    if not set(paths) <= set(PATHS):
        raise SystemExit(f"calibration_throughput.py: --paths takes {', '.join(PATHS)}, got {args.paths}")
    for flag in ("kd", "fuse_glue"):
        if not set(getattr(args, flag).split(",")) <= {"0", "1"}:
            raise SystemExit(f"calibration_throughput.py: --{flag.replace('_', '-')} takes 0 and / or 1, "
                             f"got {getattr(args, flag)}")
    micro = args.micro_batch or args.batch_size
    if args.batch_size < 1 or args.batch_size % micro:
        raise SystemExit(f"calibration_throughput.py: --micro-batch ({micro}) must divide --batch-size "
                         f"({args.batch_size})")
    device, dtype = common.setup(args)
    model = build(args.shape, args.layers, device, dtype)
    if args.stage == "lora":
        add_lora(model)
    rows = []
    lines = [f"{args.shape} shape{f' ({args.layers} layers)' if args.layers else ''}, stage {args.stage}, "
             f"{args.batch_size} x {args.seq_len} tokens per step, micro-batch {micro}, {args.dtype} weights, "
             "bf16 autocast", "",
             "| loss path | teacher | glue | step s | tokens/s | TFLOP/s | MFU | peak GiB |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    print(lines[0], flush=True)
    from wide.modeling.fuse import fuse_glue, unfuse_glue

    for fused in (bool(int(f)) for f in args.fuse_glue.split(",")):
        if fused:
            fuse_glue(model, args.glue_backend)
        glue = "compiled" if fused else "eager"
        for path in paths:
            for kd in (bool(int(k)) for k in args.kd.split(",")):
                if path == "hf" and kd:
                    continue  # HF's loss has no teacher term
                try:
                    r = measure(model, path, kd, micro, args.batch_size, args.seq_len, device, args.warmup,
                                args.iters)
                except torch.OutOfMemoryError:  # the hf path at large batches: say so and go on
                    lines.append(f"| {path} | {'yes' if kd else 'no'} | {glue} | out of memory | | | | |")
                    torch.cuda.empty_cache()
                    continue
                r["glue"] = glue
                rows.append(r)
                mfu = "–" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
                mem = "–" if r["peak_mem_gib"] is None else f"{r['peak_mem_gib']:.1f}"
                lines.append(f"| {path} | {'yes' if kd else 'no'} | {glue} | {r['step_s']:.3f} | "
                             f"{r['tokens_per_s']:,.0f} | {r['tflops']:.1f} | {mfu} | {mem} |")
                print(lines[-1], flush=True)
        if fused:
            unfuse_glue(model)
    common.report(args, {"args": vars(args), "rows": rows}, "\n".join(lines), device)


if __name__ == "__main__":
    main()
