"""Deadline jobs: the least-cost program against brute force, exact billing, deadlines met, the
emulated on-demand market, released spares, and bad input."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from liveput.cli.main import main
from liveput.errors import LiveputError
from liveput.perf import load_profile
from liveput.plan.deadline import solve_deadline
from liveput.policies import POLICIES, Decision, Observation, Policy, Provisioning
from liveput.policies.common import ConfigurationLookup, restart_s
from liveput.policies.deadline import DEADLINE_POLICIES, DEADLINE_POLICY_NAMES
from liveput.policies.objective import JobObjective
from liveput.sim import SimulationConfig, simulate_policy
from liveput.sim.deadline import (
    _delays,
    all_on_demand_hours,
    make_deadline_context,
    simulate_deadline,
    simulate_deadline_policy,
)
from liveput.traces import IntervalTrace, generate_trace, write_trace

GPT = load_profile("gpt-1.5b")
FAST = SimulationConfig(predictor="persistence")


def flat_trace(count: int, intervals: int) -> IntervalTrace:
    zeros = np.zeros(intervals, dtype=int)
    return IntervalTrace("flat", 60.0, np.full(intervals, count), zeros, zeros)


def job_for(trace: IntervalTrace, factor: float, hours: float = 1.5) -> JobObjective:
    """Work the trace's peak on-demand cluster trains in ``hours``, due at ``factor`` times the
    all-on-demand time."""
    context = make_deadline_context(
        trace, GPT, JobObjective(1e6, target_samples=1.0), FAST, check=False
    )
    lookup = ConfigurationLookup(context.policy)
    samples = lookup.throughput(lookup.best_for(context.on_demand_max)) * hours * 3600
    base = all_on_demand_hours(trace, GPT, JobObjective(1.0, target_samples=samples), FAST)
    return JobObjective(deadline_hours=factor * base, target_samples=samples)


# --- the program ------------------------------------------------------------------------------
def _brute_force(gains: np.ndarray, costs: np.ndarray, work: int) -> float:
    best = math.inf
    for path in itertools.product(range(gains.shape[1]), repeat=gains.shape[0]):
        done = sum(gains[k, c] for k, c in enumerate(path))
        if done >= work:
            best = min(best, sum(costs[k, c] for k, c in enumerate(path)))
    return best


def test_the_deadline_program_matches_brute_force_on_small_random_cases() -> None:
    rng = np.random.default_rng(16)
    for _ in range(300):
        intervals, choices = int(rng.integers(1, 5)), int(rng.integers(1, 4))
        gains = rng.integers(0, 6, (intervals, choices))
        costs = rng.uniform(0, 10, (intervals, choices)).round(2)
        work = int(rng.integers(0, 16))
        schedule = solve_deadline(gains, costs, work)
        expected = _brute_force(gains, costs, work)
        assert schedule.cost == pytest.approx(expected) or (
            math.isinf(expected) and math.isinf(schedule.cost)
        )
        if math.isfinite(expected):
            path = schedule.path()
            assert sum(gains[k, c] for k, c in enumerate(path)) >= work
            assert sum(costs[k, c] for k, c in enumerate(path)) == pytest.approx(expected)


def test_the_deadline_program_refuses_bad_shapes() -> None:
    with pytest.raises(LiveputError, match="alike"):
        solve_deadline(np.zeros((2, 2)), np.zeros((2, 3)), 1)


# --- decisions and objectives -----------------------------------------------------------------
def test_provisioning_is_beside_the_configuration_and_consistent() -> None:
    decision = Decision(None, provisioning=Provisioning(spot=3, on_demand=2))
    assert decision.num_on_demand == 2
    with pytest.raises(LiveputError, match="provisioning asks"):
        Decision(None, num_on_demand=1, provisioning=Provisioning(3, 2))
    with pytest.raises(LiveputError, match=">= 0"):
        Provisioning(-1, 0)


def test_job_objective_validates_its_fields() -> None:
    assert JobObjective(2.0, steps=10).samples(global_batch_size=128) == 1280
    with pytest.raises(LiveputError, match="one of them"):
        JobObjective(2.0, steps=10, target_samples=5.0)
    with pytest.raises(LiveputError, match="positive"):
        JobObjective(0.0, steps=10)
    with pytest.raises(LiveputError, match="not both"):
        JobObjective(2.0, steps=10, budget_usd=100.0, budget_usd_per_hour=10.0)


def test_the_registry_names_are_the_reported_ones() -> None:
    assert sorted(DEADLINE_POLICY_NAMES) == DEADLINE_POLICIES.names()


# --- the executor -----------------------------------------------------------------------------
def test_spot_only_on_a_flat_trace_matches_hand_computation() -> None:
    trace = flat_trace(16, 400)
    job = JobObjective(deadline_hours=5.0, target_samples=200_000.0)
    context = make_deadline_context(trace, GPT, job, FAST)
    run = simulate_deadline_policy(trace, GPT, "spot-only", context, FAST)
    lookup = ConfigurationLookup(context.policy)
    best = lookup.best_for(16)
    # The first start loads no checkpoint (nothing trained yet): the restart alone.
    launch_s = context.policy.costs.restart_s(best.num_instances)
    assert launch_s < restart_s(context.policy, best)
    finish_s = launch_s + 200_000.0 / lookup.throughput(best)
    assert run.finished_hours == pytest.approx(finish_s / 3600)
    # Only the instances the configuration uses are held (the spares are released).
    assert run.usd_spot == pytest.approx(
        best.num_instances * finish_s / 3600 * context.policy.spot_price_usd_per_hour
    )
    assert run.usd_on_demand == 0.0 and run.deadline_met and run.samples == 200_000.0


def test_on_demand_billing_is_every_instance_second_from_grant_to_release() -> None:
    trace = generate_trace(16, 6.0, seed=4).resample(60.0)
    job = job_for(trace, 1.3)
    context = make_deadline_context(trace, GPT, job, FAST)
    for name in ("on-demand", "uniform-progress", "liveput"):
        run = simulate_deadline_policy(trace, GPT, name, context, FAST)
        seconds = sum(release - grant for grant, release in run.on_demand_ledger)
        assert run.on_demand_hours == pytest.approx(seconds / 3600)
        assert run.usd_on_demand == pytest.approx(
            seconds / 3600 * context.policy.on_demand_price_usd_per_hour
        )
        assert run.cost_usd == pytest.approx(run.usd_spot + run.usd_on_demand)
        assert np.all(np.diff(run.cumulative_cost_usd) >= -1e-9)
        assert all(release >= grant for grant, release in run.on_demand_ledger)


def test_on_demand_launches_take_the_seeded_delays_for_every_policy() -> None:
    trace = flat_trace(8, 300)
    job = JobObjective(deadline_hours=4.0, target_samples=100_000.0, on_demand_max=12)
    context = make_deadline_context(trace, GPT, job, FAST)
    run = simulate_deadline_policy(trace, GPT, "on-demand", context, FAST)
    grants = sorted(grant for grant, _ in run.on_demand_ledger)
    delay = _delays(FAST)
    # Every instance is asked for at time 0: its grant is its draw, in [60, 90] s.
    assert grants == pytest.approx(sorted(delay(i) for i in range(len(grants))))
    assert all(60.0 <= grant <= 90.0 for grant in grants)
    assert run.spot.sum() == 0 and run.usd_spot == 0.0


def test_the_on_demand_policy_meets_every_feasible_deadline() -> None:
    for seed in range(3):
        trace = generate_trace(16, 6.0, seed=seed).resample(60.0)
        for factor in (1.05, 1.3, 2.0):
            config = SimulationConfig(predictor="persistence", seed=seed)
            job = job_for(trace, factor)
            context = make_deadline_context(trace, GPT, job, config)
            run = simulate_deadline_policy(trace, GPT, "on-demand", context, config)
            assert run.deadline_met, (seed, factor, run.hours_late)


def test_liveput_meets_the_deadlines_of_seeded_traces_and_pays_less_than_on_demand() -> None:
    for seed, regime in ((0, "default"), (1, "volatile"), (2, "calm")):
        trace = generate_trace(16, 6.0, seed=seed, regime=regime).resample(60.0)
        for factor in (1.2, 2.0):
            config = SimulationConfig(predictor="persistence", seed=seed)
            result = simulate_deadline(
                trace, GPT, job_for(trace, factor), ["liveput", "on-demand"], config
            )
            liveput = result.runs["liveput"]
            assert liveput.deadline_met, (seed, factor, liveput.hours_late)
            assert liveput.cost_usd < result.runs["on-demand"].cost_usd


def test_a_budget_per_hour_caps_the_on_demand_instances() -> None:
    trace = flat_trace(8, 300)
    # The deadline asks for about 14 on-demand instances; the budget allows 10.
    job = JobObjective(
        deadline_hours=4.0, target_samples=400_000.0, on_demand_max=16, budget_usd_per_hour=31.0
    )
    context = make_deadline_context(trace, GPT, job, FAST)
    run = simulate_deadline_policy(trace, GPT, "on-demand", context, FAST)
    # $31/h buys 10 on-demand instances at $3.06 (no spot held).
    assert run.on_demand.max() == 10 and run.spot.sum() == 0


def test_a_policy_that_never_trains_is_reported_unfinished_at_the_cap() -> None:
    trace = flat_trace(4, 60)  # gpt-1.5b needs 6 instances at least
    job = JobObjective(deadline_hours=1.0, target_samples=10_000.0, on_demand_max=16)
    result = simulate_deadline(trace, GPT, job, ["spot-only", "on-demand"], FAST)
    stuck = result.runs["spot-only"]
    assert stuck.finished_hours is None and not stuck.deadline_met
    assert stuck.hours_late == pytest.approx(1.0)  # the replay stops at twice the deadline
    # Nothing runs, but the four spot instances are kept (what it would start on): 2 h of them.
    assert stuck.samples == 0.0 and stuck.cost_usd == pytest.approx(4 * 2.0 * 1.25)
    assert result.runs["on-demand"].deadline_met


def test_the_deadline_is_refused_below_the_fastest_possible_finish() -> None:
    trace = flat_trace(16, 100)
    with pytest.raises(LiveputError, match="fastest possible finish"):
        make_deadline_context(trace, GPT, JobObjective(0.1, target_samples=1e7), FAST)
    with pytest.raises(LiveputError, match="below the cheapest instance"):
        make_deadline_context(
            trace, GPT, JobObjective(5.0, target_samples=1e3, budget_usd_per_hour=0.1), FAST
        )


# --- released spares in the interval simulator -----------------------------------------------
@POLICIES.register("test-release-three")
class _ReleaseThree(Policy):
    """Runs nothing, gives back three spares in the first interval; remembers what it saw."""

    seen: list[int] = []

    def decide(self, observation: Observation) -> Decision:
        if observation.event == "interval":
            type(self).seen.append(observation.num_available)
        return Decision(None, release=3 if observation.interval_index == 0 else 0)


def test_released_spares_are_not_available_in_the_next_interval() -> None:
    _ReleaseThree.seen = []
    run = simulate_policy(flat_trace(10, 4), GPT, "test-release-three", FAST)
    # Released at t, booting again during t + 1, back at t + 2.
    assert _ReleaseThree.seen == [10, 7, 10, 10]
    held = np.array([7, 7, 10, 10])
    assert run.cost_usd == pytest.approx(held.sum() * 60 / 3600 * 1.25)


# --- the CLI ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def short_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("deadline") / "short.json"
    write_trace(generate_trace(16, 3.0, seed=2), path)
    return path


def test_cli_deadline_json_has_the_documented_fields(
    short_trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "report"
    assert (
        main(
            [
                "simulate",
                "--trace",
                str(short_trace),
                "--deadline-hours",
                "2",
                "--steps",
                "600",
                "--json",
                "--report",
                str(report),
            ]
        )
        == 0
    )
    document = json.loads(capsys.readouterr().out)
    assert list(document["policies"]) == list(DEADLINE_POLICY_NAMES)
    for entry in document["policies"].values():
        assert {
            "deadline_met",
            "hours_late",
            "finished_hours",
            "usd",
            "usd_spot",
            "usd_on_demand",
            "on_demand_hours",
        } <= set(entry)
        assert entry["usd"] == pytest.approx(entry["usd_spot"] + entry["usd_on_demand"])
    assert document["target_samples"] == 600 * GPT.global_batch_size
    assert document["policies"]["on-demand"]["deadline_met"] is True
    assert document["policies"]["on-demand"]["usd_spot"] == 0.0
    page = (report / "index.html").read_text()
    assert page.count("data:image/png;base64,") == 2
    assert (report / "deadline_cost.png").is_file() and (report / "mix.png").is_file()


def test_cli_deadline_sweep_prints_the_paper_table(
    short_trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sweep.json"
    assert (
        main(
            [
                "simulate",
                "--trace",
                str(short_trace),
                "--sweep",
                "--steps",
                "300",
                "--policies",
                "on-demand,spot-only",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 4 * 3 * 2  # deadlines x seeds x policies
    assert sorted({row["factor"] for row in rows}) == [1.1, 1.3, 1.5, 2.0]
    assert all(row["deadline_met"] for row in rows if row["policy"] == "on-demand")
    assert "all-on-demand time" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--deadline-hours", "0.01", "--steps", "1000"], "fastest possible finish"),
        (
            ["--deadline-hours", "5", "--steps", "100", "--budget-usd-per-hour", "0.5"],
            "below the cheapest instance",
        ),
        (
            ["--deadline-hours", "5", "--steps", "100", "--budget-usd", "0.5"],
            "below one hour of the cheapest instance",
        ),
        (
            ["--deadline-hours", "5", "--steps", "100", "--policies", "liveput,varuna"],
            "unknown deadline policy 'varuna'",
        ),
        (["--deadline-hours", "5"], "needs its work"),
        (["--steps", "100"], "needs --deadline-hours"),
        (["--deadline-hours", "5", "--steps", "100", "--target-samples", "5"], "not both"),
    ],
)
def test_cli_deadline_bad_input_is_one_line_and_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", *args]) == 2
    error = capsys.readouterr().err.strip()
    assert message in error and "\n" not in error and "Traceback" not in error
