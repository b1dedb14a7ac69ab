"""A stop-loss against persistence: a forecaster may stray from persistence only while its record
is no worse than persistence's by more than a set share.

Notation, per step h and for one loss (``auto`` keeps one for the absolute error of its point and
one for the CRPS of its distribution): ``S_p`` the summed loss of persistence's forecasts scored so
far, ``S_a`` that of the forecasts actually issued. A new forecast may differ from persistence at
step h only while

    S_a <= (1 + slack) * S_p.

Once the issued forecasts fall behind, step h issues persistence's forecast, whose error is
``S_p``'s own, until persistence's further errors (times ``1 + slack``) make up the gap. The issued
record can overshoot the bound only by the forecasts still in flight when it was crossed (at most h
of them at step h; for the absolute error each is off by at most its distance from persistence's
point), so over a long trace ``S_a / S_p`` stays within ``1 + slack`` plus a term that shrinks as
``S_p`` grows. Why not hedge the in-flight forecasts as well (a strict guarantee): a forecaster
that has earned nothing yet may then not stray at all, so it never earns anything; measured, it
gave up the whole gain on the p3 trace.
"""

from __future__ import annotations

import numpy as np


class StopLoss:
    """The stop-loss rule of the module docstring, per step h."""

    def __init__(self, horizon: int, slack: float) -> None:
        if slack < 0:
            raise ValueError(f"stop-loss slack must be >= 0, got {slack}")
        self.slack = slack
        self.baseline = np.zeros(horizon)
        """``S_p``: persistence's loss scored so far, per step (instances)."""
        self.issued = np.zeros(horizon)
        """``S_a``: the issued forecasts' loss scored so far, per step (instances)."""

    def open_steps(self) -> np.ndarray:
        """Steps at which a forecast may stray from persistence now."""
        return self.issued <= (1 + self.slack) * self.baseline + 1e-9

    def settle(self, step_index: int, baseline_error: float, issued_error: float) -> None:
        """Step ``step_index`` of an issued forecast was scored; the errors are losses of either
        kind (absolute error or CRPS, in instances)."""
        self.baseline[step_index] += baseline_error
        self.issued[step_index] += issued_error
