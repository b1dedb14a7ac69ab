"""The simulator: hand-computed replays, invariants, cost accounting and bad input."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from liveput.errors import LiveputError
from liveput.perf import MigrationCostModel, estimate_configs, load_profile
from liveput.perf.configuration import Configuration
from liveput.policies import POLICIES, Decision, Observation, Policy
from liveput.policies.common import checkpoint_save_s, restart_s
from liveput.sim import DEFAULT_POLICIES, SimulationConfig, simulate, simulate_policy
from liveput.sim.engine import InvariantError, _Draws, make_context
from liveput.traces import IntervalTrace, generate_trace

GPT = load_profile("gpt-1.5b")
FAST = SimulationConfig(predictor="persistence")


def flat_trace(count: int, intervals: int, price: float | None = None) -> IntervalTrace:
    zeros = np.zeros(intervals, dtype=int)
    return IntervalTrace("flat", 60.0, np.full(intervals, count), zeros, zeros, price)


def one_loss_trace(count: int, intervals: int, at: int, lost: int) -> IntervalTrace:
    counts = np.full(intervals, count)
    counts[at + 1 :] = count - lost
    preempted = np.zeros(intervals, dtype=int)
    preempted[at] = lost
    return IntervalTrace("loss", 60.0, counts, preempted, np.zeros(intervals, dtype=int))


@POLICIES.register("test-greedy-overreach")
class _Overreach(Policy):
    """Asks for one instance more than there is: the simulator must refuse it."""

    def decide(self, observation: Observation) -> Decision:
        return Decision(Configuration(observation.num_available + 1, 1))


def best(count: int) -> tuple[Configuration, float]:
    d, p, throughput = estimate_configs(GPT, 32).best_for(count)
    return Configuration(d, p), throughput


def test_flat_trace_matches_hand_computation() -> None:
    trace = flat_trace(16, 30)
    result = simulate(trace, GPT, ["ideal", "reactive", "liveput"], FAST)
    configuration, throughput = best(16)
    context = make_context(trace, GPT, FAST)
    ideal = throughput * 60.0 * 30
    assert result.runs["ideal"].samples == pytest.approx(ideal)
    # Both start from nothing: one launch and no change after. Nothing has trained, so there
    # is no checkpoint: the launch is the restart alone, without the load a restore adds.
    launch = context.costs.restart_s(configuration.num_instances)
    assert launch < restart_s(context, configuration)
    assert result.runs["reactive"].samples == pytest.approx(throughput * (60.0 * 30 - launch))
    assert result.runs["reactive"].reconfigurations == 1
    liveput = result.runs["liveput"]
    assert liveput.samples <= ideal
    assert liveput.samples >= throughput * (60.0 * 30 - 2 * launch)
    assert result.fraction_of_ideal("ideal") == pytest.approx(1.0)


def test_only_a_job_that_has_trained_restores_a_checkpoint() -> None:
    """The first start from nothing pays the restart alone; a start from nothing after
    training (a total loss) pays the policy's whole restore, the checkpoint's load included."""
    from liveput.sim.job import SimulatedJob

    context = make_context(flat_trace(16, 3), GPT, FAST)
    configuration, _ = best(16)
    restore = Decision(configuration, downtime_s=restart_s(context, configuration))
    job = SimulatedJob(context, 0)
    job.apply(restore, 16, 0.0)
    assert job.moving_s == pytest.approx(context.costs.restart_s(configuration.num_instances))
    job.run(60.0)
    assert job.samples > 0
    job.apply(Decision(None), 16, 60.0)
    job.apply(restore, 16, 60.0)
    assert job.moving_s == pytest.approx(restart_s(context, configuration))
    assert job.moving_s > context.costs.restart_s(configuration.num_instances)


def test_cost_is_every_instance_hour_held_at_its_price() -> None:
    trace = flat_trace(10, 60, price=0.9)
    config = SimulationConfig(predictor="persistence", on_demand_price_usd_per_hour=3.0)
    result = simulate(trace, GPT, ["ideal", "reactive", "on-demand"], config)
    assert result.runs["ideal"].cost_usd == pytest.approx(10 * 0.9 * 1.0)
    assert result.runs["reactive"].cost_usd == pytest.approx(10 * 0.9 * 1.0)
    # On-demand runs the best configuration for the mean spot count (10), rents exactly its
    # instances at the on-demand price, and releases the spot ones.
    configuration, _ = best(10)
    assert result.runs["on-demand"].cost_usd == pytest.approx(
        configuration.num_instances * 3.0 * 1.0
    )
    starved = simulate(flat_trace(5, 10), GPT, ["on-demand"], config).runs["on-demand"]
    assert starved.samples == 0.0 and starved.cost_usd == 0.0  # nothing fits 5: nothing rented
    run = result.runs["ideal"]
    assert run.usd_per_1k_samples == pytest.approx(run.cost_usd / run.samples * 1000)
    assert np.all(np.diff(run.cumulative_cost_usd) > 0)


def test_a_preemption_takes_effect_at_its_drawn_time() -> None:
    trace = one_loss_trace(16, 10, at=4, lost=16)
    config = SimulationConfig(predictor="persistence", seed=3)
    run = simulate_policy(trace, GPT, "ideal", config)
    fraction = _Draws.make(len(trace), 3).loss_fraction[4]
    assert 0 < fraction < 1
    _, throughput = best(16)
    assert run.samples == pytest.approx(throughput * 60.0 * (4 + fraction))
    assert run.cumulative_samples[4] - run.cumulative_samples[3] == pytest.approx(
        throughput * 60.0 * fraction
    )
    # Instances lost mid-interval are billed until they go.
    price = GPT.instance_type.spot_price_usd_per_hour
    assert run.cost_usd == pytest.approx(16 * price * 60.0 * (4 + fraction) / 3600)


def test_every_policy_meets_the_same_losses_and_keeps_the_invariants() -> None:
    trace = generate_trace(24, 2.0, seed=5, regime="volatile").resample(60)
    config = SimulationConfig(predictor="persistence", num_on_demand=2)
    result = simulate(trace, GPT, list(DEFAULT_POLICIES), config)
    for run in result.runs.values():
        used = run.data_parallel * run.pipeline_stages
        assert np.all(used <= run.available + run.on_demand)
        assert np.all(run.on_demand >= 2)
        assert np.all(np.diff(run.cumulative_samples) >= 0)
        assert run.samples == pytest.approx(run.cumulative_samples[-1])
        assert run.samples <= result.ideal_samples * 1.0000001 or run.policy == "on-demand"
    assert np.array_equal(result.runs["ideal"].available, trace.count)


def test_the_simulator_refuses_a_decision_that_does_not_fit() -> None:
    with pytest.raises(InvariantError, match="only"):
        simulate_policy(flat_trace(8, 3), load_profile("tiny-gpt"), "test-greedy-overreach")


def test_too_few_instances_simulates_with_zero_progress() -> None:
    trace = flat_trace(8, 20)  # GPT-6.7B needs 12 instances at least
    result = simulate(trace, load_profile("gpt-6.7b"), list(DEFAULT_POLICIES), FAST)
    for name, run in result.runs.items():
        assert run.samples == 0.0, name
        assert np.all(run.data_parallel == 0)
    assert result.fraction_of_ideal("liveput") is None
    assert result.runs["reactive"].cost_usd > 0  # the instances were held all the same
    assert result.to_json()["policies"]["reactive"]["fraction_of_ideal"] is None


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: IntervalTrace("empty", 60.0, [], [], []), "empty"),
        (lambda: flat_trace(0, 5), "never has an instance"),
        (lambda: IntervalTrace("coarse", 300.0, [4, 4], [0, 0], [0, 0]), "resample"),
    ],
)
def test_bad_traces_get_one_line_errors(make, message: str) -> None:
    with pytest.raises(LiveputError, match=message):
        simulate(make(), GPT, ["ideal"])


def test_unknown_policy_and_bad_config() -> None:
    with pytest.raises(LiveputError, match="unknown policy 'nope'; known: .*liveput"):
        simulate(flat_trace(8, 2), GPT, ["nope"])
    with pytest.raises(LiveputError, match="objective"):
        SimulationConfig(objective="speed")
    with pytest.raises(LiveputError, match="on-demand"):
        SimulationConfig(num_on_demand=-1)


def test_on_demand_instances_held_all_along_add_progress_and_cost() -> None:
    trace = generate_trace(16, 1.0, seed=2, regime="volatile").resample(60)
    plain = simulate_policy(trace, GPT, "liveput", FAST)
    anchored = simulate_policy(
        trace, GPT, "liveput", SimulationConfig(predictor="persistence", num_on_demand=4)
    )
    assert anchored.samples > plain.samples
    extra = 4 * GPT.instance_type.on_demand_price_usd_per_hour * trace.hours
    assert anchored.cost_usd == pytest.approx(plain.cost_usd + extra)


def test_liveput_beats_the_reactive_systems_on_a_p3_like_market() -> None:
    trace = generate_trace(32, 3.0, seed=11, regime="p3-like").resample(60)
    result = simulate(trace, GPT, list(DEFAULT_POLICIES), FAST)
    samples = {name: run.samples for name, run in result.runs.items()}
    for rival in ("reactive", "bamboo", "checkpoint"):
        assert samples["liveput"] > samples[rival], rival
    assert samples["liveput"] >= 0.9 * samples["liveput-oracle"]
    assert samples["liveput-oracle"] <= samples["ideal"]


def test_checkpoint_rollback_costs_the_work_since_the_last_checkpoint() -> None:
    # 12 instances, a loss of all of them in interval 5: the job re-does what it trained since
    # its last checkpoint once instances return (interval 6 on).
    counts = np.array([12] * 6 + [0] + [12] * 8)
    preempted = np.zeros(15, dtype=int)
    preempted[5] = 12
    allocated = np.zeros(15, dtype=int)
    allocated[6] = 12
    trace = IntervalTrace("wipe", 60.0, counts, preempted, allocated)
    context = make_context(trace, GPT, FAST)
    checkpoint = simulate_policy(trace, GPT, "checkpoint", FAST)
    reactive = simulate_policy(trace, GPT, "reactive", FAST)
    configuration, _ = best(12)
    assert checkpoint.downtime_s > 2 * restart_s(context, configuration)
    assert checkpoint.samples < reactive.samples
    assert checkpoint_save_s(context, configuration) == pytest.approx(
        MigrationCostModel().checkpoint_save_s(float(GPT.layer_state_bytes().sum()))
    )


def test_the_cost_objective_buys_samples_cheaper() -> None:
    trace = generate_trace(32, 1.5, seed=7).resample(60)
    fast = simulate_policy(trace, GPT, "liveput", FAST)
    cheap = simulate_policy(
        trace, GPT, "liveput", SimulationConfig(predictor="persistence", objective="cost")
    )
    assert cheap.usd_per_1k_samples < fast.usd_per_1k_samples
    assert cheap.cost_usd < fast.cost_usd
    assert fast.samples > cheap.samples


def test_an_actual_table_changes_what_the_job_trains_not_what_the_policy_decides() -> None:
    """bench peers' sim-to-real: the policy plans with its estimate, the job trains at the
    rates measured (there, four emulated instances share two cores). Halving every rate halves
    the samples, with the same decisions."""

    from liveput.sim.engine import make_context

    trace = generate_trace(16, 1.0, seed=2, regime="volatile").resample(60)
    context = make_context(trace, GPT, FAST)
    half = dataclasses.replace(context.table, samples_per_s=context.table.samples_per_s / 2)
    planned = simulate_policy(trace, GPT, "liveput", FAST, context)
    slower = simulate_policy(trace, GPT, "liveput", FAST, context, actual=half)
    np.testing.assert_array_equal(slower.data_parallel, planned.data_parallel)
    np.testing.assert_array_equal(slower.pipeline_stages, planned.pipeline_stages)
    assert slower.samples == pytest.approx(planned.samples / 2)


def test_online_calibration_refits_on_what_the_job_trained_and_replans_with_it() -> None:
    """The simulator does the runtime's online calibration: every ``every_s`` the
    configurations trained for ``min_trained_s`` are measured at the step time they really
    train at (the actual table), the fit is asked only when that set changed, and the policy
    plans with what it returns from then on: the same decisions as a policy that planned with
    that table from the start, once the first re-fit is made."""

    from liveput.sim.engine import OnlineCalibration, make_context

    trace = generate_trace(16, 1.0, seed=2, regime="volatile").resample(60)
    context = make_context(trace, GPT, FAST)
    # The truth: more instances, less: a configuration of n instances trains at 1/n of its
    # estimate (as if every instance shared one machine).
    used = context.table.data_parallel * context.table.pipeline_stages
    truth = dataclasses.replace(
        context.table, samples_per_s=context.table.samples_per_s / np.maximum(used, 1)
    )
    calls: list[tuple] = []

    def fit(measurements):
        calls.append(measurements)
        return truth

    every_s = 5 * FAST.interval_s
    learned = simulate_policy(
        trace,
        GPT,
        "liveput",
        FAST,
        context,
        actual=truth,
        learn=OnlineCalibration(every_s=every_s, fit=fit),
    )
    assert len(calls) >= 1 and len({frozenset(c) for c in calls}) == len(calls)
    grid = truth.throughput_grid(context.max_instances)
    for measurements in calls:
        for m in measurements:
            assert m.iteration_s == pytest.approx(
                GPT.global_batch_size / grid[m.data_parallel, m.pipeline_stages]
            )
    # After the first re-fit (at the first multiple of every_s once a configuration trained),
    # the choices are those of a policy that knew the truth.
    first = next(t for t in range(len(trace)) if learned.data_parallel[t] != 0)
    start = (first // 5 + 1) * 5
    knew = simulate_policy(
        trace, GPT, "liveput", FAST, dataclasses.replace(context, table=truth), actual=truth
    )
    unaware = simulate_policy(trace, GPT, "liveput", FAST, context, actual=truth)
    sizes = learned.data_parallel * learned.pipeline_stages
    assert (sizes[start:] <= (unaware.data_parallel * unaware.pipeline_stages)[start:]).all()
    assert learned.samples > unaware.samples
    np.testing.assert_array_equal(
        sizes[start + 5 :], (knew.data_parallel * knew.pipeline_stages)[start + 5 :]
    )
