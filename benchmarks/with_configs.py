"""Runs a command with the column-major decode gemm_k configs a sweep found best (`gemv_sweep.py --colmajor
--best-json F`) in `wide.kernels.triton.gemm_k.COLMAJOR_DECODE`, in this process: the same session times end to end
what it just swept, without a code edit in between. Not a benchmark itself (no timing).

    PYTHONPATH=. python3 benchmarks/with_configs.py best.json wide.cli bench --weight-layout column ...
    PYTHONPATH=. python3 benchmarks/with_configs.py best.json benchmarks/profile_decode.py --weight-layout column ...

The file maps ``"<rows>,<wide>"`` (rows 1 or 16; wide: groups of >= 512 channels) to `GemmConfig` fields; a missing
file or key keeps the table's entry. Prints the table it ran with.
"""
import argparse
import json
import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def apply(best: dict) -> dict:
    """Puts ``best``'s entries into `COLMAJOR_DECODE`; returns the table."""
    from wide.kernels.triton import gemm_k
    from wide.kernels.triton.common import GemmConfig

    for key, fields in best.items():
        rows, wide = key.split(",")
        if int(rows) not in (1, 16) or wide not in ("True", "False"):
            raise ValueError(f"best configs: key {key!r} is not '<1|16>,<True|False>'")
        gemm_k.COLMAJOR_DECODE[(int(rows), wide == "True")] = GemmConfig(**fields)
    return gemm_k.COLMAJOR_DECODE


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("best_json", help="gemv_sweep.py --best-json output (missing: the table as it is)")
    ap.add_argument("target", help="a module (wide.cli) or a script path (benchmarks/profile_decode.py)")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    args = ap.parse_args(argv)
    path = Path(args.best_json)
    table = apply(json.loads(path.read_text()) if path.is_file() else {})
    for key, cfg in sorted(table.items()):
        print(f"COLMAJOR_DECODE[{key}] = {cfg}", flush=True)
    sys.argv = [args.target, *args.args]
    if args.target.endswith(".py"):
        runpy.run_path(args.target, run_name="__main__")
    else:
        runpy.run_module(args.target, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
