"""Runs a command with the column-major decode gemm_k configs a sweep found best (`gemv_sweep.py --colmajor
--best-json F`) in `wide.kernels.triton.gemm_k.COLMAJOR_DECODE`, in this process: the same session times end to end
what it just swept, without a code edit in between.

    PYTHONPATH=. python3 benchmarks/with_configs.py best.json wide.cli bench --weight-layout column ...
    PYTHONPATH=. python3 benchmarks/with_configs.py best.json benchmarks/profile_decode.py --weight-layout column ...

The file maps ``"<rows>,<wide>"`` (rows 1 or 16; wide: groups of >= 512 channels) to `GemmConfig` fields; keys it
lacks keep the table's entry. Prints the table it ran with.
"""
import json
import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        raise SystemExit(__doc__)
    from wide.kernels.triton import gemm_k
    from wide.kernels.triton.common import GemmConfig

    path, target, rest = Path(argv[0]), argv[1], argv[2:]
    best = json.loads(path.read_text()) if path.is_file() else {}
    for key, fields in best.items():
        rows, wide = key.split(",")
        gemm_k.COLMAJOR_DECODE[(int(rows), wide == "True")] = GemmConfig(**fields)
    for key, cfg in sorted(gemm_k.COLMAJOR_DECODE.items()):
        print(f"COLMAJOR_DECODE[{key}] = {cfg}", flush=True)
    sys.argv = [target, *rest]
    if target.endswith(".py"):
        runpy.run_path(target, run_name="__main__")
    else:
        runpy.run_module(target, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
