"""Stage 1: router calibration with the backbone frozen."""

from __future__ import annotations

from wide.tasks.base import WideTask


class RouterCalibration(WideTask):
    """Trains only the routers (backbone frozen) with ``LM + lam * |target - realized skip rate|``.

    Takes ``WideTask``'s arguments unchanged (default learning rate 2e-3).
    """

    stage = "calibrate"
