"""Policies decide from observations: hand-checked decisions, recovery against brute force."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from liveput.errors import LiveputError
from liveput.forecast.base import Forecast
from liveput.perf import MigrationCostModel, estimate_configs, load_profile
from liveput.perf.configuration import Configuration
from liveput.plan import LiveputOptimizer, OptimizerConfig, migration_seconds
from liveput.policies import POLICIES, Decision, Observation, PolicyContext, make_policy
from liveput.policies.bamboo import adjacent_loss, redundancy_factor
from liveput.policies.common import (
    ConfigurationLookup,
    checkpoint_save_s,
    restart_s,
    surviving_pipelines,
)
from liveput.sim import DEFAULT_POLICIES
from liveput.traces import IntervalTrace

GPT = load_profile("gpt-1.5b")
TABLE = estimate_configs(GPT, 32)
CONTEXT = PolicyContext(
    GPT, TABLE, MigrationCostModel.from_profile(GPT), capacity=32, predictor="persistence"
)


def history(counts: list[int], preempted: list[int] | None = None) -> IntervalTrace:
    counts_array = np.array(counts)
    lost = np.zeros(len(counts), dtype=int) if preempted is None else np.array(preempted)
    allocated = np.append(np.diff(counts_array) + lost[:-1], 0)
    return IntervalTrace("h", 60.0, counts_array, lost, allocated)


def observe(
    count: int, current: Configuration | None, time_s: float = 0.0, **extra: object
) -> Observation:
    counts = extra.pop("counts", [count])
    return Observation(
        time_s=time_s,
        interval_index=len(counts) - 1,
        interval_s=60.0,
        history=history(counts),
        num_available=count,
        current=current,
        capacity=32,
        remaining_s=float(extra.pop("remaining_s", 60.0)),
        **extra,
    )


def test_every_default_policy_is_registered() -> None:
    assert set(DEFAULT_POLICIES) <= set(POLICIES.names())
    with pytest.raises(LiveputError, match="unknown policy"):
        make_policy("varuna", CONTEXT)


def test_decisions_and_contexts_refuse_bad_values() -> None:
    with pytest.raises(LiveputError, match="throughput factor"):
        Decision(None, throughput_factor=1.5)
    with pytest.raises(LiveputError, match=">= 0"):
        Decision(None, downtime_s=-1)
    with pytest.raises(LiveputError, match="instances used"):
        Decision(Configuration(2, 2), num_instances_used=5)
    with pytest.raises(LiveputError, match="capacity"):
        PolicyContext(GPT, TABLE, MigrationCostModel(), capacity=-1)


def test_ideal_runs_the_table_best_for_every_count() -> None:
    ideal = make_policy("ideal", CONTEXT)
    for count in (5, 6, 13, 24, 32):
        decision = ideal.decide(observe(count, None))
        found = TABLE.best_for(count)
        expected = None if found is None else Configuration(found[0], found[1])
        assert decision.configuration == expected
        assert decision.downtime_s == 0.0


def test_surviving_pipelines_is_d_minus_the_worst_stage() -> None:
    configuration = Configuration(4, 3)
    assert surviving_pipelines(configuration, ()) == 4
    assert surviving_pipelines(configuration, ((0, 1), (2, 1), (3, 0))) == 2
    assert surviving_pipelines(configuration, ((0, 0), (1, 1), (2, 2))) == 3


def test_reactive_restarts_on_every_change_and_pays_save_restart_load() -> None:
    reactive = make_policy("reactive", CONTEXT)
    first = reactive.decide(observe(16, None))
    target = first.configuration
    assert first.downtime_s == pytest.approx(restart_s(CONTEXT, target))  # launch: no save
    assert reactive.decide(observe(16, target, 60.0)).downtime_s == 0.0
    hit = reactive.decide(
        observe(15, target, 90.0, event="preemption", lost_spares=1, remaining_s=30.0)
    )
    lookup = ConfigurationLookup(CONTEXT)
    assert hit.configuration == lookup.best_for(15)
    assert hit.downtime_s == pytest.approx(
        restart_s(CONTEXT, hit.configuration) + checkpoint_save_s(CONTEXT, target)
    )
    grown = reactive.decide(observe(20, hit.configuration, 120.0))
    assert grown.migration == "restart" and grown.configuration == lookup.best_for(20)


def test_checkpoint_keeps_its_configuration_and_rolls_back_on_a_hit() -> None:
    policy = make_policy("checkpoint", CONTEXT)
    fixed = policy.decide(observe(16, None)).configuration
    assert fixed == ConfigurationLookup(CONTEXT).best_for(16)
    assert policy.decide(observe(30, fixed, 60.0)).configuration == fixed  # never resized
    decision = policy.decide(
        observe(29, fixed, 150.0, event="preemption", lost_slots=((0, 0),), remaining_s=30.0)
    )
    launch = restart_s(CONTEXT, fixed)
    # Trained since the start: 150 s minus the launch, nothing checkpointed yet (Young's period
    # with the prior rate is longer than that).
    assert decision.rollback_s == pytest.approx(150.0 - launch)
    assert decision.downtime_s == pytest.approx(launch)
    waiting = policy.decide(observe(fixed.num_instances - 1, None, 180.0))
    assert waiting.configuration is None


def test_bamboo_overhead_and_adjacency_by_hand() -> None:
    forward = sum(layer.forward_s for layer in GPT.layers)
    backward = sum(layer.backward_s for layer in GPT.layers)
    share = forward / (forward + backward)
    micro = GPT.global_batch_size / (4 * GPT.micro_batch_size)
    expected = 1 - max(0.0, micro * share - 7) / (micro + 7)
    assert redundancy_factor(CONTEXT, np.array([4]), np.array([8]))[0] == pytest.approx(expected)
    assert adjacent_loss(Configuration(2, 4), ((0, 1), (0, 2)))
    assert adjacent_loss(Configuration(2, 4), ((1, 3), (1, 0)))  # the last stage's successor
    assert not adjacent_loss(Configuration(2, 4), ((0, 1), (1, 2)))
    assert not adjacent_loss(Configuration(2, 4), ((0, 0), (0, 2)))


def test_bamboo_absorbs_scattered_losses_and_restarts_on_adjacent_ones() -> None:
    bamboo = make_policy("bamboo", CONTEXT)
    running = bamboo.decide(observe(24, None)).configuration
    assert running is not None and running.data_parallel >= 2
    scattered = bamboo.decide(
        observe(
            22, running, 30.0, event="preemption", lost_slots=((0, 0), (1, 2)), remaining_s=30.0
        )
    )
    assert scattered.migration in ("failover", "intra-stage")
    assert scattered.downtime_s < 5.0
    adjacent = make_policy("bamboo", CONTEXT)
    running = adjacent.decide(observe(24, None)).configuration
    crash = adjacent.decide(
        observe(
            22, running, 30.0, event="preemption", lost_slots=((0, 0), (0, 1)), remaining_s=30.0
        )
    )
    assert crash.migration == "restart"
    assert crash.downtime_s == pytest.approx(restart_s(CONTEXT, crash.configuration))


def test_recovery_is_the_best_configuration_for_the_rest_of_the_interval() -> None:
    """``LiveputOptimizer.recover`` against enumerating every candidate by hand."""
    optimizer = LiveputOptimizer(GPT, TABLE, CONTEXT.costs, OptimizerConfig())
    rng = np.random.default_rng(0)
    feasible = [
        (int(d), int(p))
        for d, p, ok in zip(TABLE.data_parallel, TABLE.pipeline_stages, TABLE.feasible)
        if ok
    ]
    for _ in range(12):
        start = Configuration(*feasible[int(rng.integers(len(feasible)))])
        available = int(rng.integers(start.num_instances, 33))
        remaining = float(rng.uniform(1, 60))
        plan = optimizer.recover(start, available, remaining)
        d = np.array([0] + [c[0] for c in feasible])
        p = np.array([0] + [c[1] for c in feasible])
        seconds = migration_seconds(GPT, CONTEXT.costs, d, p, available)
        begin = feasible.index((start.data_parallel, start.pipeline_stages)) + 1
        values = [
            TABLE.throughput_grid(32)[dd, pp] * max(remaining - seconds[begin, k], 0.0)
            if dd * pp <= available and k
            else 0.0
            for k, (dd, pp) in enumerate(zip(d, p))
        ]
        assert plan.expected_samples == pytest.approx(max(values))
        assert plan.configuration.num_instances <= available


def test_when_no_move_ends_within_the_interval_recovery_ranks_them_over_the_look_ahead() -> None:
    """A stage lost with seconds of the interval left, every move longer than that: the
    recovery moves (salvaging the stage) to the candidate that trains most over the rest of the
    interval and the optimizer's horizon after it, by enumeration, instead of running nothing."""
    config = OptimizerConfig()
    optimizer = LiveputOptimizer(GPT, TABLE, CONTEXT.costs, config)
    rng = np.random.default_rng(1)
    candidates = [
        (int(d), int(p))
        for d, p, ok in zip(TABLE.data_parallel, TABLE.pipeline_stages, TABLE.feasible)
        if ok
    ]
    depths = sorted({p for d, p in candidates if d == 1})
    d = np.array([0] + [c[0] for c in candidates])
    p = np.array([0] + [c[1] for c in candidates])
    grid = TABLE.throughput_grid(32)
    window = config.horizon * config.interval_s
    for _ in range(12):
        depth = depths[int(rng.integers(len(depths)))]
        available = int(rng.integers(depth, 33))
        remaining = float(rng.uniform(0.0, 0.2))  # below any rebuild: no move ends in time
        plan = optimizer.recover(None, available, remaining, salvage_stages=depth)
        hit = candidates.index((1, depth)) + 1
        seconds = migration_seconds(GPT, CONTEXT.costs, d, p, available)[hit]
        seconds[hit] = CONTEXT.costs.rebuild_s(available) + CONTEXT.costs.transfer_s(
            float(GPT.layer_state_bytes().sum()) / depth
        )
        assert (seconds[1:] > remaining).all()
        values = [
            grid[dd, pp] * max(remaining + window - seconds[k], 0.0)
            if k and dd * pp <= available
            else 0.0
            for k, (dd, pp) in enumerate(zip(d, p))
        ]
        best = int(np.argmax(values))
        assert values[best] > 0
        assert plan.configuration == Configuration(int(d[best]), int(p[best]))
        assert plan.expected_samples == 0.0  # nothing trains in the rest of the interval


def test_optimizer_charges_a_restore_as_the_policies_do() -> None:
    """A restore loads the whole checkpoint in both, whatever the depth."""
    from liveput.policies.common import restart_s

    d, p = np.array([0, 4, 2, 1]), np.array([0, 8, 16, 32])
    seconds = migration_seconds(GPT, CONTEXT.costs, d, p, 32)
    for k in range(1, len(d)):
        assert seconds[0, k] == pytest.approx(restart_s(CONTEXT, Configuration(d[k], p[k])))


def test_liveput_regroups_survivors_and_salvages_a_lost_stage_within_the_notice() -> None:
    policy = make_policy("liveput", CONTEXT)
    running = Configuration(2, 8)
    regroup = policy.decide(
        observe(
            16,
            running,
            30.0,
            event="preemption",
            lost_slots=((1, 3),),
            remaining_s=30.0,
            counts=[17],
        )
    )
    assert regroup.configuration is not None
    assert regroup.downtime_s < 10.0  # no restart: survivors regroup or re-partition
    wiped = dict(event="preemption", lost_slots=((0, 3), (1, 3)), remaining_s=40.0, counts=[16])
    # Stage 3 lost both replicas; during the 120-s notice its state leaves the dying instances:
    # a transfer and a rebuild, no checkpoint.
    salvaged = policy.decide(observe(14, running, 20.0, **wiped))
    stage_bytes = float(GPT.layer_state_bytes().sum()) / 8
    assert salvaged.configuration is not None
    assert salvaged.migration in ("inter-stage", "pipeline")
    assert salvaged.downtime_s <= (
        CONTEXT.costs.rebuild_s(14) + CONTEXT.costs.transfer_s(stage_bytes) + 1e-9
    )
    # Without a notice the state comes back from the checkpoint (or the rest of the interval is
    # not worth a restore).
    deaf = make_policy("liveput", replace(CONTEXT, preemption_notice_s=0.0))
    restored = deaf.decide(observe(14, running, 20.0, **wiped))
    assert restored.migration in ("checkpoint-restore", "none")
    if restored.configuration is not None:
        assert restored.downtime_s >= CONTEXT.costs.restart_s(14)


def test_the_oracle_forecasts_the_true_future() -> None:
    oracle = make_policy("liveput-oracle", CONTEXT)
    counts = [20, 20, 18, 18, 25]
    trace = IntervalTrace("f", 60.0, counts, [0, 2, 0, 0, 0], [0, 0, 0, 7, 0])
    observation = Observation(
        0.0, 0, 60.0, trace.head(1), 20, None, future=trace.window(1), capacity=32
    )
    forecast = oracle.forecast(observation)
    assert isinstance(forecast, Forecast)
    assert forecast.point[:4].tolist() == [20, 18, 18, 25]
    assert forecast.point[4:].tolist() == [25] * (CONTEXT.horizon - 4)
    assert forecast.expected_preempted[:3].tolist() == [0, 2, 0]


def test_a_change_during_a_reactive_restart_queues_a_full_morph() -> None:
    reactive = make_policy("reactive", CONTEXT)
    launch = reactive.decide(observe(20, None))
    running = launch.configuration
    hit = reactive.decide(
        observe(18, running, 10.0, event="preemption", lost_slots=((0, 0),), remaining_s=50.0)
    )
    # The launch had launch.downtime_s - 10 s to go; then save, restart and load in turn.
    assert hit.downtime_s == pytest.approx(
        launch.downtime_s
        - 10.0
        + checkpoint_save_s(CONTEXT, running)
        + restart_s(CONTEXT, hit.configuration)
    )


def test_a_refitted_policy_remembers_the_job_and_plans_with_the_new_table() -> None:
    """A re-fit (the table scaled to measured step times) keeps what the policy saw: made anew
    instead, ``reactive`` forgot the count it was configured for and restarted into the same
    configuration at the next interval."""
    slower = replace(TABLE, samples_per_s=TABLE.samples_per_s * 0.5)
    for name in ("reactive", "checkpoint", "bamboo", "liveput"):
        policy = make_policy(name, CONTEXT)
        running = policy.decide(observe(24, None)).configuration
        refitted = policy.refitted(replace(CONTEXT, table=slower))
        assert type(refitted) is type(policy) and refitted.context.table is slower
        for attribute in policy.remembered:
            assert getattr(refitted, attribute) is getattr(policy, attribute), (name, attribute)
        if name == "reactive":
            kept = refitted.decide(observe(24, running, 60.0, counts=[24, 24]))
            assert kept.configuration == running and kept.downtime_s == 0.0
            forgot = make_policy(name, replace(CONTEXT, table=slower))
            assert forgot.decide(observe(24, running, 60.0, counts=[24, 24])).downtime_s > 0
    assert make_policy("reactive", CONTEXT).remembered == ("configured_for", "busy_until_s")


def test_liveput_moves_onto_noticed_arrivals_only_where_the_move_pays_before_they_go() -> None:
    """Eight instances arrive, each with a preemption notice: over slow links (a pipeline's
    state takes a minute to move) the job stays where it is, where it moved onto them when the
    notices were unknown; over fast links (seconds) it still uses them for the time they have."""
    slow = replace(CONTEXT, costs=replace(CONTEXT.costs, network_gbps=0.2))
    running = Configuration(2, 8)
    noticed = (100.0,) * 8
    unknown = make_policy("liveput", slow).decide(observe(24, running, counts=[16, 24]))
    assert unknown.configuration is not None and unknown.configuration.num_instances > 16
    known = make_policy("liveput", slow).decide(
        observe(24, running, counts=[16, 24], noticed_ends_s=noticed)
    )
    assert (known.configuration, known.downtime_s) == (running, 0.0)
    fast = make_policy("liveput", CONTEXT).decide(
        observe(24, running, counts=[16, 24], noticed_ends_s=(30.0,) * 8)
    )
    assert fast.configuration is not None and fast.configuration.num_instances > 16
