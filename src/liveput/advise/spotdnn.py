"""spotDNN's performance and loss models of asynchronous parameter-server training on
heterogeneous workers, with least-squares fits of their parameters.

Per worker i (all units seconds, Gb/s, GB):
    T_i      = T_comp,i + T_comm,i                                    iteration time, s
    T_comm,i = 2 * 8S / B_i + 2 g_i * 8S / B_pcie                      S model size GB, g_i GPUs
    B_i      = P(n) B_ps / n + (1 - P(n)) B_req,i   if B_req,i > B_ps / n, else B_req,i
    P(n)     = min(a1 sqrt(n) + b1, 1)                                 PS contention, a1, b1 >= 0
Cluster of n workers:
    T_exp = 1 / sum_i 1 / T_i            s per (asynchronous) iteration
    v     = sum_i b_i / T_i              samples/s;  b_w = v T_exp  weighted batch, samples
    w_i   = (b_i / T_i) / v;             R = || (w_(1), ..., w_(n)) - (1, 0, ..., 0) ||_2,
          w_(1) the largest share (R = 0 for one worker, sqrt((n-1)/n) for n equal ones)
Loss after j iterations:
    L(j) = (g2 b_w + g3) sqrt((R + g4) n) / (j + g1) + g5
so a target loss L* < g5 + ... needs j* = max(0, (g2 b_w + g3) sqrt((R + g4) n) / (L* - g5) - g1)
iterations, i.e. j* T_exp seconds.

Every function is vectorized over clusters: ``counts[k, t]`` workers of type t in cluster k.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from liveput.errors import LiveputError


@dataclass(frozen=True)
class WorkerType:
    """One worker instance type as the model sees it."""

    name: str
    """Instance type name."""
    compute_s: float
    """T_comp: compute time of one iteration at batch ``batch``, s."""
    batch: int
    """b: samples per iteration of this worker."""
    gpus: int
    """g: GPUs of the worker."""
    bandwidth_gbps: float
    """B_req: the worker's network bandwidth, Gb/s."""
    usd_per_hour: float
    """Its price per hour (spot)."""
    vcpus: int = 0
    """vCPUs (for quotas)."""
    family: str = ""
    """Quota family."""

    def __post_init__(self) -> None:
        if not (
            self.compute_s > 0
            and self.batch >= 1
            and self.gpus >= 1
            and self.bandwidth_gbps > 0
            and self.usd_per_hour > 0
        ):
            raise LiveputError(
                f"worker type {self.name}: compute_s, batch, gpus, bandwidth and "
                "price must be positive"
            )


@dataclass(frozen=True)
class SpotDNNParams:
    """Parameters of the performance and loss models."""

    model_gb: float
    """S: model size pushed and pulled each iteration, GB."""
    ps_bandwidth_gbps: float
    """B_ps: the parameter server's network bandwidth, Gb/s."""
    pcie_gbps: float = 128.0
    """B_pcie: host-GPU bandwidth, Gb/s (PCIe 3.0 x16, 16 GB/s)."""
    a1: float = 0.1
    """Contention slope of P(n) = min(a1 sqrt(n) + b1, 1), dimensionless."""
    b1: float = 0.0
    """Contention intercept of P(n)."""
    g: tuple[float, float, float, float, float] = (1000.0, 0.0, 1600.0, 10.0, 0.1)
    """Loss coefficients (g1 iterations, g2 per sample, g3, g4, g5 loss floor)."""

    def __post_init__(self) -> None:
        if not (self.model_gb > 0 and self.ps_bandwidth_gbps > 0 and self.pcie_gbps > 0):
            raise LiveputError("spotDNN parameters: model size and bandwidths must be positive")
        if self.a1 < 0 or self.b1 < 0 or len(self.g) != 5:
            raise LiveputError("spotDNN parameters: a1, b1 >= 0 and five loss coefficients")


@dataclass(frozen=True)
class ClusterPrediction:
    """The models' figures for each cluster (arrays over clusters)."""

    workers: np.ndarray
    """n."""
    iteration_s: np.ndarray
    """T_exp, s."""
    weighted_batch: np.ndarray
    """b_w, samples."""
    convergence_r: np.ndarray
    """R."""
    usd_per_hour: np.ndarray
    """Sum of the workers' prices, $/h."""


def contention(workers: np.ndarray, params: SpotDNNParams) -> np.ndarray:
    """P(n)."""
    return np.minimum(params.a1 * np.sqrt(workers) + params.b1, 1.0)


def worker_times(counts: np.ndarray, types: list[WorkerType], params: SpotDNNParams) -> np.ndarray:
    """T_i of each type in each cluster (clusters x types), s."""
    counts = np.atleast_2d(counts)
    n = counts.sum(axis=1, keepdims=True).astype(float)
    share = params.ps_bandwidth_gbps / np.maximum(n, 1.0)
    required = np.array([t.bandwidth_gbps for t in types])[None, :]
    p = contention(n, params)
    bandwidth = np.where(required > share, p * share + (1 - p) * required, required)
    gpus = np.array([t.gpus for t in types], dtype=float)[None, :]
    bits = 8.0 * params.model_gb
    compute = np.array([t.compute_s for t in types])[None, :]
    return compute + 2 * bits / bandwidth + 2 * gpus * bits / params.pcie_gbps


def predict(
    counts: np.ndarray, types: list[WorkerType], params: SpotDNNParams
) -> ClusterPrediction:
    """T_exp, b_w, R and price of each cluster (rows of ``counts``, n >= 1)."""
    counts = np.atleast_2d(counts).astype(float)
    times = worker_times(counts, types, params)
    batch = np.array([t.batch for t in types], dtype=float)[None, :]
    rate = (counts / times).sum(axis=1)
    iteration_s = 1.0 / rate
    speed = batch / times  # samples/s of one worker of each type
    v = (counts * speed).sum(axis=1)
    weights = speed / v[:, None]
    top = np.where(counts > 0, weights, 0.0).max(axis=1)
    r2 = (counts * weights**2).sum(axis=1) - 2 * top + 1.0
    price = counts @ np.array([t.usd_per_hour for t in types])
    return ClusterPrediction(
        counts.sum(axis=1), iteration_s, v * iteration_s, np.sqrt(np.maximum(r2, 0.0)), price
    )


def loss_after(
    iterations: np.ndarray, prediction: ClusterPrediction, params: SpotDNNParams
) -> np.ndarray:
    """L(j) of each cluster after ``iterations`` asynchronous iterations."""
    g1, g2, g3, g4, g5 = params.g
    scale = (g2 * prediction.weighted_batch + g3) * np.sqrt(
        (prediction.convergence_r + g4) * prediction.workers
    )
    return scale / (np.asarray(iterations, dtype=float) + g1) + g5


def iterations_to_loss(
    target_loss: float, prediction: ClusterPrediction, params: SpotDNNParams
) -> np.ndarray:
    """j*: iterations each cluster needs to reach ``target_loss``."""
    g1, g2, g3, g4, g5 = params.g
    if target_loss <= g5:
        raise LiveputError(
            f"target loss {target_loss:g} is at or below the loss model's floor "
            f"g5 = {g5:g}; no cluster reaches it"
        )
    scale = (g2 * prediction.weighted_batch + g3) * np.sqrt(
        (prediction.convergence_r + g4) * prediction.workers
    )
    return np.maximum(scale / (target_loss - g5) - g1, 0.0)


def fit_contention(
    workers: np.ndarray, bandwidth_gbps: np.ndarray, required_gbps: float, ps_bandwidth_gbps: float
) -> tuple[float, float]:
    """(a1, b1) by least squares from measured per-worker bandwidths of n-worker clusters whose
    workers all require ``required_gbps`` (only contended points, B_req > B_ps / n, inform)."""
    n = np.asarray(workers, dtype=float)
    measured = np.asarray(bandwidth_gbps, dtype=float)
    share = ps_bandwidth_gbps / n
    contended = required_gbps > share
    if contended.sum() < 2:
        raise LiveputError(
            "contention fit needs at least 2 contended measurements "
            "(worker bandwidth above B_ps / n)"
        )
    n, measured, share = n[contended], measured[contended], share[contended]
    # B = P share + (1 - P) B_req  =>  P = (B_req - B) / (B_req - share)
    target_p = (required_gbps - measured) / (required_gbps - share)

    def residuals(theta: np.ndarray) -> np.ndarray:
        return np.minimum(theta[0] * np.sqrt(n) + theta[1], 1.0) - target_p

    from scipy.optimize import least_squares  # on use: the CLI imports this module at start-up

    result = least_squares(residuals, np.array([0.1, 0.0]), bounds=([0, 0], [10, 1]))
    return float(result.x[0]), float(result.x[1])


def fit_loss(
    iterations: np.ndarray,
    losses: np.ndarray,
    weighted_batch: np.ndarray,
    convergence_r: np.ndarray,
    workers: np.ndarray,
) -> tuple[float, float, float, float, float]:
    """(g1..g5) by least squares from loss curves of profiling runs (one row per point)."""
    j, loss, bw, r, n = (
        np.asarray(a, dtype=float)
        for a in (iterations, losses, weighted_batch, convergence_r, workers)
    )
    if not (j.shape == loss.shape == bw.shape == r.shape == n.shape) or len(j) < 6:
        raise LiveputError("loss fit needs at least 6 points with equal-length columns")

    def residuals(theta: np.ndarray) -> np.ndarray:
        g1, g2, g3, g4, g5 = theta
        return (g2 * bw + g3) * np.sqrt((r + g4) * n) / (j + g1) + g5 - loss

    start = np.array(
        [
            max(float(j.min()), 1.0) + 10.0,
            0.0,
            float(loss.max() - loss.min()) * (float(np.median(j)) + 10.0),
            1.0,
            float(loss.min()) * 0.9,
        ]
    )
    from scipy.optimize import least_squares  # on use: the CLI imports this module at start-up

    result = least_squares(
        residuals,
        start,
        bounds=([1e-6, -1e3, -1e9, 1e-6, -1e3], [1e9, 1e3, 1e9, 1e3, 1e3]),
        x_scale="jac",
    )
    return tuple(float(x) for x in result.x)  # type: ignore[return-value]
