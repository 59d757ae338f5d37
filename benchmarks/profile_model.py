"""Profile one eager decode step (and a prefill) of a local model with trained routers: top CUDA kernels.

    python benchmarks/profile_model.py --model qwen2.5-1.5b --checkpoint runs/.../routers.safetensors --batch 16
"""
import argparse

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--checkpoint", default=None)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--coherent", action="store_true")
    ap.add_argument("--rows", type=int, default=30)
    args = ap.parse_args()
    import wide
    from wide.bench.models import build_model
    from wide.bench.runners import DecodeRunner
    from wide.io.checkpoint import load_trained, read_metadata
    from wide.modeling.inference import enable_kernels, set_coherent_decode

    model = build_model(args.model, None, "cuda", torch.bfloat16)
    if args.checkpoint:
        wide.apply_wide(model, read_metadata(args.checkpoint)["wide_config"])
        load_trained(model, args.checkpoint)
        model.eval()
        enable_kernels(model, "triton")
        if args.coherent:
            set_coherent_decode(model, 1)
    runner = DecodeRunner(model, args.batch, args.context, graphs=False)
    for _ in range(3):
        runner.step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(2):
            runner.step()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=args.rows, max_name_column_width=70))


if __name__ == "__main__":
    main()
