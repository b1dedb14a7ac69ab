"""DeepVM's logistic scaling model: speedup of n data-parallel nodes of one instance type.

``S(n) = c / (1 + exp(-a (n - b)))``, dimensionless (speedup over one node, as measured); a is the
steepness per node, b the midpoint in nodes, c the plateau speedup. Fits published by DeepVM for
three types; a user's measured speedups are fitted by least squares (``fit_logistic``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from liveput.catalog import InstanceSpec
from liveput.errors import LiveputError


@dataclass(frozen=True)
class LogisticScaling:
    """``S(n) = c / (1 + exp(-a (n - b)))``."""

    a: float
    """Steepness, 1/node."""
    b: float
    """Midpoint, nodes."""
    c: float
    """Plateau speedup (dimensionless)."""
    source: str = ""
    """Where the fit comes from."""

    def __post_init__(self) -> None:
        if not (self.a > 0 and self.c > 0 and np.isfinite(self.b)):
            raise LiveputError(
                f"logistic scaling needs a > 0, c > 0 and finite b; got "
                f"a={self.a}, b={self.b}, c={self.c}"
            )

    def speedup(self, nodes: np.ndarray | float) -> np.ndarray:
        """S(n) for each n (n >= 1); vectorized."""
        n = np.asarray(nodes, dtype=float)
        return self.c / (1.0 + np.exp(-self.a * (n - self.b)))


PUBLISHED_FITS = {
    "g3s.xlarge": LogisticScaling(0.1409, 14.49, 13.53, "DeepVM published fit"),
    "g4dn.xlarge": LogisticScaling(0.1339, 12.87, 6.18, "DeepVM published fit"),
    "g5.xlarge": LogisticScaling(0.0853, 20.07, 4.96, "DeepVM published fit"),
}
"""DeepVM's fits (a, b, c), per instance type."""

_FIT_BY_GPU = {"M60": "g3s.xlarge", "T4": "g4dn.xlarge", "A10G": "g5.xlarge"}
DEFAULT_FIT = "g4dn.xlarge"
"""Fit used for a type whose GPU model has no published fit (the middle of the three)."""


def scaling_for(
    spec: InstanceSpec, fits: dict[str, LogisticScaling] | None = None
) -> LogisticScaling:
    """The user's fit of ``spec`` if given, else the published fit of its type, else of its GPU
    model (T4 -> g4dn.xlarge, ...), else the g4dn.xlarge fit."""
    if fits and spec.name in fits:
        return fits[spec.name]
    if spec.name in PUBLISHED_FITS:
        return PUBLISHED_FITS[spec.name]
    return PUBLISHED_FITS[_FIT_BY_GPU.get(spec.gpu, DEFAULT_FIT)]


def fit_logistic(
    nodes: np.ndarray, speedups: np.ndarray, source: str = "least-squares fit"
) -> LogisticScaling:
    """Least-squares fit of (a, b, c) to measured speedups ``speedups[k]`` at ``nodes[k]``."""
    n = np.asarray(nodes, dtype=float)
    s = np.asarray(speedups, dtype=float)
    if n.shape != s.shape or len(n) < 3:
        raise LiveputError("logistic fit needs at least 3 (nodes, speedup) pairs of equal length")
    if (n < 1).any() or not (s > 0).all():
        raise LiveputError("logistic fit needs nodes >= 1 and speedups > 0")

    def residuals(theta: np.ndarray) -> np.ndarray:
        a, b, c = theta
        return c / (1.0 + np.exp(-a * (n - b))) - s

    start = np.array([0.2, float(np.median(n)), float(s.max()) * 1.5])
    # scipy is imported on use: the CLI imports this module at start-up.
    from scipy.optimize import least_squares

    result = least_squares(residuals, start, bounds=([1e-6, -1e3, 1e-6], [10.0, 1e4, 1e6]))
    a, b, c = result.x
    return LogisticScaling(float(a), float(b), float(c), source)
