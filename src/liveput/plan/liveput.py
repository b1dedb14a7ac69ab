"""Exact liveput: expected throughput of a configuration when k of its instances are preempted.

Notation. A configuration (D, P) runs on ``n`` spot instances and ``o`` on-demand ones. Stage j
(j = 1..P) has D slots: ``o_j`` on-demand (placed evenly: ``o_j = floor(o / P)`` or one more; a
loss hurts most where it breaks a pipeline, and every stage is equally likely to lose an instance,
so spreading them raises the weakest stage) and ``s_j = D - o_j`` spot; the other
``r = n - sum_j s_j`` spot instances are spares. ``k`` spot instances are preempted, uniformly
among the n: the losses per stage and among spares follow a multivariate hypergeometric law.

After the losses, the survivors of each stage regroup into complete pipelines (an intra-stage
migration, no state moves), so ``min_j c_j`` pipelines run, with ``c_j`` survivors of stage j.

    P(min_j c_j >= t | k) = [x^k] prod_j ( sum_{l=0}^{s_j - max(0, t - o_j)} C(s_j, l) x^l )
                                   * (1 + x)^r  /  C(n, k)

and ``E[thr(min_j c_j, P) | k] = sum_{t>=1} P(min >= t | k) * (thr(t, P) - thr(t - 1, P))``.
Everything is exact polynomial arithmetic on integers (floats of exact binomials); the
Monte-Carlo sampler below is kept only as a test oracle. The optimizer needs these only mixed over
a binomial number of losses, which is an expectation under independent losses where the spares
drop out: it uses that form (:mod:`liveput.plan.interval`); this exact form is its reference.
"""

from __future__ import annotations

import numpy as np


def _stage_polynomial(spot: int, max_lost: int) -> np.ndarray:
    """sum_{l=0}^{max_lost} C(spot, l) x^l as coefficients (empty -> zero polynomial)."""
    if max_lost < 0:
        return np.zeros(1)
    # scipy is imported on use: the CLI imports this package at start-up.
    from scipy.special import comb

    lost = np.arange(min(max_lost, spot) + 1)
    return comb(spot, lost)


def _power(polynomial: np.ndarray, exponent: int) -> np.ndarray:
    result = np.ones(1)
    base = polynomial
    while exponent:
        if exponent & 1:
            result = np.convolve(result, base)
        exponent >>= 1
        if exponent:
            base = np.convolve(base, base)
    return result


def on_demand_per_stage(num_on_demand: int, data_parallel: int, pipeline_stages: int) -> np.ndarray:
    """On-demand instances in each stage (spread evenly, at most D per stage)."""
    used = min(num_on_demand, data_parallel * pipeline_stages)
    per_stage = np.full(pipeline_stages, used // pipeline_stages)
    per_stage[: used % pipeline_stages] += 1
    return per_stage


def survival_tail(
    data_parallel: int, pipeline_stages: int, max_spares: int, num_on_demand: int = 0
) -> np.ndarray:
    """``tail[t, r, k]`` = P(min_j c_j >= t | k preempted) with r spot spares, for
    t = 0..D, r = 0..max_spares, k = 0..(spot in use + r); 0 where k exceeds the spot instances."""
    on_demand = on_demand_per_stage(num_on_demand, data_parallel, pipeline_stages)
    spot = data_parallel - on_demand
    used_spot = int(spot.sum())
    width = used_spot + max_spares + 1
    spares = np.arange(max_spares + 1)
    lost = np.arange(width)
    from scipy.special import comb  # on use: the CLI imports this package at start-up

    # spare_ways[r, i] = C(r, i): ways to lose i spares out of r.
    spare_ways = comb(spares[:, None], lost[None, :])
    total_ways = comb((used_spot + spares)[:, None], lost[None, :])
    tail = np.zeros((data_parallel + 1, max_spares + 1, width))
    for needed in range(data_parallel + 1):
        polynomial = np.ones(1)
        for spot_j, on_demand_j in zip(
            *np.unique(np.stack([spot, on_demand]), axis=1), strict=True
        ):
            count = int(np.sum((spot == spot_j) & (on_demand == on_demand_j)))
            stage = _stage_polynomial(int(spot_j), int(spot_j) - max(0, needed - int(on_demand_j)))
            polynomial = np.convolve(polynomial, _power(stage, count))
        padded = np.zeros(width)
        padded[: min(len(polynomial), width)] = polynomial[:width]
        # ways[r, k] = sum_i padded[i] * C(r, k - i): a convolution per spare count, as a matrix.
        shift = np.zeros((width, width))
        for i in np.flatnonzero(padded):
            shift[np.arange(width - i), np.arange(i, width)] = padded[i]
        ways = spare_ways @ shift
        with np.errstate(divide="ignore", invalid="ignore"):
            tail[needed] = np.where(
                total_ways > 0, ways / np.where(total_ways > 0, total_ways, 1), 0.0
            )
    return np.clip(tail, 0.0, 1.0)


def expected_throughput_after_losses(
    throughput_by_pipelines: np.ndarray,
    data_parallel: int,
    pipeline_stages: int,
    max_spares: int,
    num_on_demand: int = 0,
) -> np.ndarray:
    """``E[thr(min_j c_j, P) | k]`` for r spares and k preempted: shape (max_spares + 1, width).

    ``throughput_by_pipelines[t]`` is the throughput of t pipelines of P stages (t = 0..D).
    """
    tail = survival_tail(data_parallel, pipeline_stages, max_spares, num_on_demand)
    gains = np.diff(throughput_by_pipelines[: data_parallel + 1])
    return np.einsum("t,trk->rk", gains, tail[1:])


def monte_carlo_throughput_after_losses(
    throughput_by_pipelines: np.ndarray,
    data_parallel: int,
    pipeline_stages: int,
    num_spares: int,
    num_lost: int,
    num_on_demand: int = 0,
    samples: int = 20_000,
    seed: int = 0,
) -> tuple[float, float]:
    """Test oracle: sample which spot instances are lost; returns (mean, standard error)."""
    rng = np.random.default_rng(seed)
    on_demand = on_demand_per_stage(num_on_demand, data_parallel, pipeline_stages)
    spot_stage = np.repeat(np.arange(pipeline_stages), data_parallel - on_demand)
    owners = np.concatenate([spot_stage, np.full(num_spares, -1)])
    values = np.empty(samples)
    for index in range(samples):
        lost = rng.choice(len(owners), size=num_lost, replace=False)
        losses = np.bincount(owners[lost][owners[lost] >= 0], minlength=pipeline_stages)
        values[index] = throughput_by_pipelines[int((data_parallel - losses).min())]
    return float(values.mean()), float(values.std(ddof=1) / np.sqrt(samples))
