"""Performance model: fit to the measured table and time to score every configuration."""

from __future__ import annotations

import time

import numpy as np

from liveput.perf import estimate_configs, load_profile
from liveput.perf.calibrate import mape_floor
from liveput.perf.measured import measured_table


def main() -> None:
    print(
        f"{'model':12s} {'MAPE':>7s} {'target':>7s} {'floor':>7s} {'picks within 5%':>16s} "
        f"{'cut':>11s}"
    )
    for model, measured in measured_table().items():
        table = estimate_configs(load_profile(model), 32)
        lookup = {
            (int(d), int(p)): s
            for d, p, s in zip(table.data_parallel, table.pipeline_stages, table.samples_per_s)
        }
        truth = {
            (int(d), int(p)): s
            for d, p, s in zip(
                measured.data_parallel, measured.pipeline_stages, measured.samples_per_s
            )
        }
        predicted = np.array([lookup[k] for k in truth])
        actual = np.array(list(truth.values()))
        mape = np.mean(np.abs(predicted - actual) / actual)
        counts = sorted({d * p for d, p in truth})
        good = 0
        for count in counts:
            options = [k for k in truth if k[0] * k[1] <= count]
            pick = max(options, key=lambda k: (lookup[k], -k[1]))
            good += truth[pick] >= 0.95 * max(truth[k] for k in options)
        method = load_profile(model).partition_method
        floor = mape_floor(model)
        print(
            f"{model:12s} {mape * 100:6.1f}% {'15%':>7s} {floor * 100:6.1f}% "
            f"{good:>9d}/{len(counts):<6d} {method:>11s}"
        )
    print(
        "floor: a lower bound on the MAPE of any cut with any constants of the formula on "
        "the measured table (perf.calibrate.mape_floor)"
    )
    profile = load_profile("gpt-1.5b")
    estimate_configs(profile, 64)
    runs = []
    for _ in range(50):
        start = time.perf_counter()
        estimate_configs(profile, 64)
        runs.append(time.perf_counter() - start)
    median_ms = float(np.median(runs) * 1e3)
    print(
        f"estimate every (D, P) up to 64 instances: median {median_ms:.2f} ms "
        f"(target 10 ms, ratio {median_ms / 10:.2f})"
    )


if __name__ == "__main__":
    main()
