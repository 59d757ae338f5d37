"""The column-major decode configs' sweep (`benchmarks/gemv_sweep.py --colmajor --best-json`) and the runner that puts
its winners into `wide.kernels.triton.gemm_k.COLMAJOR_DECODE` for a command (`benchmarks/with_configs.py`)."""

import pytest

from tests.test_benchmarks import BENCH, _load


def test_colmajor_sweep_and_with_configs(tmp_path, capsys):
    """gemv_sweep's column-major candidates take the column-major weights' constraints; its best-configs file goes
    into gemm_k.COLMAJOR_DECODE through with_configs (a bad key is named), which then runs the target."""
    import dataclasses

    from wide.kernels.triton import gemm_k
    from wide.kernels.triton.common import GemmConfig

    mod = _load("gemv_sweep")
    assert len(set(mod.K_COL)) == len(mod.K_COL) and all(c.block_m == 1 and not c.swap for c in mod.K_COL)
    assert all(c.block_m == 16 and 128 % c.block_k == 0 for c in mod.K16_COL)
    res = [(5.0, str(mod.K_COL[0]), "1.0e-03"), (4.0, str(mod.K_COL[1]), "5.0e-01"), (6.0, "None", "1.0e-03")]
    assert mod._fastest_right(res, mod.K_COL) == dataclasses.asdict(mod.K_COL[0])  # the wrong one never wins
    best = tmp_path / "best.json"
    mod.write_best(str(best), {"1,True": dataclasses.asdict(mod.K_COL[0]), "1,False": None})
    wc = _load("with_configs")
    saved = dict(gemm_k.COLMAJOR_DECODE)
    try:
        wc.main([str(best), str(BENCH / "gemv_sweep.py"), "--help"])
    except SystemExit as exc:
        assert exc.code == 0
    try:
        assert gemm_k.COLMAJOR_DECODE[(1, True)] == mod.K_COL[0]
        assert gemm_k.COLMAJOR_DECODE[(1, False)] == saved[(1, False)]
        assert "usage:" in capsys.readouterr().out
        with pytest.raises(ValueError, match="key '2,True'"):
            wc.apply({"2,True": dataclasses.asdict(GemmConfig(1, 16, 16))})
    finally:
        gemm_k.COLMAJOR_DECODE.clear()
        gemm_k.COLMAJOR_DECODE.update(saved)
