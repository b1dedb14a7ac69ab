"""The rate of an instance count for bench peers' bound and simulator: every count's run,
short count run or longer no-preemption run, measured past its warm-up the same way, and a
run too short for that says so instead of passing its start-up off as steady."""

from __future__ import annotations

import pytest

from bench.peers_regime import PIPELINE
from bench.peers_report import table
from bench.peers_run import RunSettings, SystemRun
from liveput.traces import Trace

BATCH = 16
STEADY_STEP_S = 0.25
"""64 samples/s once warm."""


def _run(window_s: float, startup_s: float = 8.0, slow_steps: int = 10) -> SystemRun:
    """A no-preemption run: nothing until ``startup_s``, then ``slow_steps`` steps of 1 s (the
    first optimizer steps, the first checkpoint), then steps of :data:`STEADY_STEP_S` until
    ``window_s``."""
    timeline: list[tuple[float, int]] = [(0.0, 0), (startup_s / 2, 0)]
    t, samples = startup_s, 0
    for _ in range(slow_steps):
        t, samples = t + 1.0, samples + BATCH
        timeline.append((t, samples))
    while t + STEADY_STEP_S <= window_s:
        t, samples = t + STEADY_STEP_S, samples + BATCH
        timeline.append((t, samples))
    return SystemRun("liveput", samples, timeline, [])


def test_a_rate_of_an_instance_count_leaves_the_warm_up_out() -> None:
    """Ten 1-s steps before a steady 64 samples/s: from the first step a 30-s run measures
    about 45, a 60-s one about 55; past the warm-up both measure 64."""
    from bench.peers_rates import WARM_UP_SHARE, steady_rate

    short, long = _run(30.0), _run(60.0)
    assert short.rate() < 50 and long.rate() < 57  # the old rate, the bias in it
    for run in (short, long):
        rate = steady_rate(run)
        assert rate.samples_per_s == pytest.approx(BATCH / STEADY_STEP_S)
        assert not rate.warm_up_left_in
        assert rate.skipped_steps >= 10
        assert rate.skipped_steps == pytest.approx(WARM_UP_SHARE * (rate.steps - 1), abs=1)
        assert rate.from_first_step_samples_per_s == pytest.approx(run.rate())
        assert rate.to_s == run.steps()[-1][0]


def test_a_run_with_too_few_steps_keeps_its_start_up_and_says_so() -> None:
    """Eight steps: none left to measure past the warm-up, so the rate runs from the first
    step (as before) and is marked; no step at all gives 0."""
    from bench.peers_rates import MIN_MEASURED_STEPS, steady_rate, warm_up_steps

    run = _run(12.0, startup_s=8.0, slow_steps=2)
    assert len(run.steps()) - 1 - warm_up_steps(len(run.steps())) < MIN_MEASURED_STEPS
    rate = steady_rate(run)
    assert rate.warm_up_left_in and rate.skipped_steps == 0
    assert rate.samples_per_s == pytest.approx(run.rate())
    assert rate.from_s == run.steps()[0][0]
    nothing = steady_rate(SystemRun("liveput", 0, [(0.0, 0), (30.0, 0)], []))
    assert nothing.samples_per_s == 0.0 and nothing.warm_up_left_in and nothing.steps == 0
    json_keys = set(rate.to_json())
    assert {"samples_per_s", "skipped_steps", "warm_up_left_in", "timeline"} <= json_keys


def test_every_instance_count_is_measured_the_same_way(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pipeline regime: 30-s count runs for 4 to 7 instances (7's cut short), the 60-s
    no-preemption run for 8, all 1x4 at 64 samples/s once warm. The rates the bound and the
    simulator get are 64 for every count measured past its warm-up (from the first step they
    were about 45 and 55), the short run's says its start-up stayed in, and so do the line
    printed and the table."""
    from bench import bench_peers
    from bench.peers_rates import describe

    def count_run(system: str, trace: Trace, settings: RunSettings) -> SystemRun:
        assert system == "liveput" and not trace.removed.size and settings.window_s == 30.0
        return _run(12.0, slow_steps=2) if trace.initial_count == 7 else _run(30.0)

    monkeypatch.setattr(bench_peers, "run_system", count_run)
    rates, how = bench_peers.rates_by_count(RunSettings(), _run(60.0), 30.0, PIPELINE)
    assert sorted(how) == [4, 5, 6, 7, 8]
    for count in (4, 5, 6, 8):
        assert rates[count] == pytest.approx(BATCH / STEADY_STEP_S)
        assert not how[count].warm_up_left_in
    assert how[7].warm_up_left_in
    assert rates[7] == pytest.approx(_run(12.0, slow_steps=2).rate(), abs=0.01)
    line = describe(rates, how)
    assert "4: 64.0," in line and "7: " in line and "start-up left in" in line
    document = {
        "traces": [{"trace": "t", "systems": {}, "simulated": {}, "bound_samples": 1000}],
        "liveput_steady_rate_by_instances": {str(n): h.to_json() for n, h in how.items()},
    }
    assert "start-up left in (too few steps past the warm-up): 7 instances" in table(document)
