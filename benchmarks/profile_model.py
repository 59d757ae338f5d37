"""Profile eager decode steps of a local model with trained routers: its top CUDA kernels (torch.profiler).

    python benchmarks/profile_model.py --model qwen2.5-1.5b --checkpoint runs/.../routers.safetensors --batch 16

Unlike `profile_decode.py` (the bench's random-weight shape, graph replay, synthetic routers), this loads a model
and the routers a `wide fit` trained, and runs its decode steps eagerly: what a real checkpoint's kernels cost.
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import common  # noqa: E402


def main(argv=None):
    ap = common.parser(__doc__, device=None, outputs=False)
    ap.add_argument("--model", required=True, help="a local model folder or asset name")
    ap.add_argument("--checkpoint", default=None, help="trained routers (routers.safetensors); none: dense")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--coherent", action="store_true")
    ap.add_argument("--rows", type=int, default=30)
    args = ap.parse_args(argv)
    device, dtype = common.setup(args)
    if args.checkpoint and not Path(args.checkpoint).is_file():
        raise SystemExit(f"profile_model.py: --checkpoint {args.checkpoint} is not a file")

    import wide
    from wide.bench.runners import DecodeRunner
    from wide.io.checkpoint import load_trained, read_metadata
    from wide.modeling.inference import enable_kernels, set_coherent_decode

    model = common.load_model(args.model, "llama-8b", None, device, dtype)
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
    common.sync()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(2):
            runner.step()
        common.sync()
    print(common.meta_line(common.meta(device)))
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=args.rows, max_name_column_width=70))


if __name__ == "__main__":
    main()
