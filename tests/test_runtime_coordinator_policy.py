"""The coordinator's policy step: a view in, one answer out (action, provisioning, restart), with
no store, clock, market or process; the objectives it is handed, throughput and deadline."""

from __future__ import annotations

import dataclasses

from measured import tiny_gpt_profile

from liveput.errors import LiveputError
from liveput.perf.configuration import Configuration
from liveput.perf.costs import MigrationCostModel
from liveput.perf.estimator import estimate_configs
from liveput.policies import Decision, Observation, PolicyContext, Provisioning
from liveput.policies.deadline import DeadlineContext, make_deadline_policy
from liveput.policies.objective import JobObjective
from liveput.runtime.coordinator import DeadlineObjective, ThroughputObjective
from liveput.runtime.coordinator.objective import MarketReading, Planning
from liveput.runtime.coordinator.policy import (
    Answer,
    PolicyInputs,
    asks_policy,
    available,
    fit,
    history_trace,
    noticed_ends_s,
    step,
)
from liveput.runtime.decide import ActionKind, CoordinatorConfig, CoordinatorView, Member
from liveput.runtime.protocol import RuntimePlan

CONFIG = CoordinatorConfig(num_steps=200, num_micro_batches=4, capacity=6, initial_workers=2)
STEPS = 200


def _member(heartbeat_age_s: float = 0.1, **fields: object) -> Member:
    return Member(host="127.0.0.1", heartbeat_age_s=heartbeat_age_s, **fields)


def _running(members: dict[int, Member], interval_due: bool = False) -> CoordinatorView:
    """Plan 3 trains 2x1 on instances 0 and 1 from step 10; step 20 committed."""
    plan = RuntimePlan(
        3,
        0,
        10,
        STEPS,
        2,
        1,
        [0, tiny_gpt_profile().num_layers],
        {0: (0, 0), 1: (1, 0)},
        {0: "h", 1: "h"},
    )
    return CoordinatorView(
        now_s=30.0,
        members=members,
        plan=plan,
        started=plan,
        committed=20,
        all_arrived=True,
        interval_due=interval_due,
    )


def _deadline_objective(policy: str) -> tuple[DeadlineObjective, CoordinatorConfig]:
    table = estimate_configs(tiny_gpt_profile(), 8)
    context = DeadlineContext(
        PolicyContext(
            profile=tiny_gpt_profile(),
            table=table,
            costs=MigrationCostModel(),
            interval_s=60.0,
            objective="cost",
        ),
        JobObjective(deadline_hours=1.0, steps=STEPS, on_demand_max=4),
        target_samples=STEPS * tiny_gpt_profile().global_batch_size,
        on_demand_max=4,
    )
    return DeadlineObjective(context), dataclasses.replace(CONFIG, policy=policy)


def test_at_the_start_the_policy_is_asked_and_its_configuration_fitted():
    """No plan and two instances up: a start replan on what the liveput policy wants of two
    instances; the throughput objective rents nothing and asks for no restart."""
    objective = ThroughputObjective()
    planning = objective.start(tiny_gpt_profile(), CONFIG)
    view = CoordinatorView(
        now_s=1.0,
        members={0: _member(), 1: _member()},
        plan=None,
        started=None,
        committed=-1,
        interval_due=True,
    )
    assert asks_policy(view, CONFIG, objective)
    answer = step(PolicyInputs(view), CONFIG, tiny_gpt_profile(), planning, objective)
    assert answer.action.kind is ActionKind.REPLAN and answer.action.reason == "start"
    assert answer.action.workers == (0, 1)
    target = answer.action.target
    assert target is not None and target.num_instances <= 2
    assert (answer.asked, answer.provisioning, answer.restart, answer.policy_error) == (
        True,
        None,
        False,
        None,
    )
    assert not answer.action.restore


def test_nothing_to_ask_between_intervals():
    """A plan training on every instance up, no interval due: nothing to do, policy unasked."""
    objective = ThroughputObjective()
    view = _running({0: _member(), 1: _member()})
    assert not asks_policy(view, CONFIG, objective)
    answer = step(
        PolicyInputs(view),
        CONFIG,
        tiny_gpt_profile(),
        objective.start(tiny_gpt_profile(), CONFIG),
        objective,
    )
    assert answer == Answer(answer.action)
    assert answer.action.kind is ActionKind.NONE


def test_a_restart_the_policy_asks_for_restores_from_the_checkpoint():
    """Instance 1 lost: the reactive policy answers with a restart, carried out as one (every
    layer from the checkpoint); the liveput policy's answer keeps what the survivors hold."""
    members = {0: _member(), 1: _member(heartbeat_age_s=60.0), 2: _member()}
    view = _running(members)
    objective = ThroughputObjective()
    for policy, restart in (("reactive", True), ("liveput", False)):
        config = dataclasses.replace(CONFIG, policy=policy)
        answer = step(
            PolicyInputs(view, history=(2, 2)),
            config,
            tiny_gpt_profile(),
            objective.start(tiny_gpt_profile(), config),
            objective,
        )
        assert answer.action.kind is ActionKind.REPLAN and answer.action.reason == "loss"
        assert answer.action.workers == (0, 2) and answer.action.lost_slots == ((1, 0),)
        assert answer.restart is restart
        assert answer.action.restore is restart


class _Failing:
    def decide(self, observation: Observation) -> Decision:
        raise LiveputError("no forecast")


def test_a_failing_policy_keeps_the_fastest_fit():
    """The policy fails at the start: the answer carries why, and the fastest configuration on
    the instances up is planned."""
    objective = ThroughputObjective()
    started = objective.start(tiny_gpt_profile(), CONFIG)
    planning = Planning(started.calibration, started.table, _Failing())
    view = CoordinatorView(
        now_s=1.0,
        members={0: _member(), 1: _member()},
        plan=None,
        started=None,
        committed=-1,
        interval_due=True,
    )
    answer = step(PolicyInputs(view), CONFIG, tiny_gpt_profile(), planning, objective)
    assert answer.policy_error == "no forecast" and answer.asked
    assert answer.action.target == fit(None, 2, started.table, tiny_gpt_profile(), CONFIG)


def test_the_deadline_objective_provisions_every_interval_even_with_no_instance():
    """No instance up and no plan: the rules wait. The deadline objective still has its
    policy asked at the interval, and its answer says what to rent: the on-demand policy's
    fewest on-demand instances for the whole work by the deadline. The throughput objective
    asks nothing then; neither asks between intervals."""
    objective, config = _deadline_objective("on-demand")
    planning = objective.start(tiny_gpt_profile(), config)
    view = CoordinatorView(
        now_s=6.0, members={}, plan=None, started=None, committed=-1, interval_due=True
    )
    assert asks_policy(view, config, objective)
    assert not asks_policy(view, config, ThroughputObjective())
    assert not asks_policy(dataclasses.replace(view, interval_due=False), config, objective)
    answer = step(
        PolicyInputs(view, market=MarketReading(0, 0.0)),
        config,
        tiny_gpt_profile(),
        planning,
        objective,
    )
    assert answer.action.kind is ActionKind.WAIT and answer.asked
    time_s = view.now_s * config.policy_interval_s / config.interval_s
    expected = make_deadline_policy("on-demand", objective.context).fewest_on_demand(
        objective.context.target_samples,
        objective.context.objective.deadline_s - time_s - objective.context.lead_s,
    )
    assert expected is not None and expected > 0
    # The on-demand policy holds no spot instance, so it releases any the market offers.
    assert answer.provisioning == Provisioning(spot=0, on_demand=expected, spot_hold=0)


def test_the_deadline_objective_tells_the_policy_the_work_and_the_market():
    """What a deadline policy sees: spot and on-demand apart (a noticed on-demand one not
    counted), the samples done and left, the time to the deadline, the market's figures."""
    objective, config = _deadline_objective("on-demand")
    members = {0: _member(), 1: _member(on_demand=True), 2: _member(on_demand=True, noticed=True)}
    view = _running(members)
    observation = Observation(
        time_s=900.0,
        interval_index=3,
        interval_s=60.0,
        history=history_trace((3, 3, 3, 3), 3, 60.0),
        num_available=3,
        current=Configuration(2, 1),
        capacity=6,
    )
    seen = objective.observation(
        observation, view, MarketReading(2, 1.5), tiny_gpt_profile(), config
    )
    done = 21.0 * tiny_gpt_profile().global_batch_size
    assert (seen.num_available, seen.num_on_demand) == (2, 1)
    assert (seen.samples_done, seen.samples_remaining) == (
        done,
        STEPS * tiny_gpt_profile().global_batch_size - done,
    )
    assert seen.seconds_to_deadline == 3600.0 - 900.0
    assert (seen.on_demand_pending, seen.usd_spent) == (2, 1.5)


def test_available_leaves_out_the_gone_and_the_going():
    members = {
        0: _member(),
        1: _member(heartbeat_age_s=60.0),
        2: _member(left=True),
        3: _member(noticed=True),
        4: _member(noticed=True, notice_lead_s=120.0),
    }
    view = _running(members)
    assert available(view, CONFIG) == [0, 4]


def test_the_policy_is_told_when_the_noticed_instances_it_may_plan_on_go():
    """At an interval, the observation carries the end each available instance's notice
    announces, in policy seconds (a 2-s wall interval stands for 60 s); not those going (no
    longer available): a notice whose lead is nearly spent, or one that announces no end."""
    members = {
        0: _member(),
        1: _member(noticed=True, notice_lead_s=40.0, notice_age_s=10.0),  # ends in 30 s
        2: _member(noticed=True, notice_lead_s=None),  # a bare SIGTERM: going at once
        3: _member(noticed=True, notice_lead_s=40.0, notice_age_s=30.0),  # going: 10 s left
    }
    view = _running(members, interval_due=True)
    scale = CONFIG.policy_interval_s / CONFIG.interval_s
    assert available(view, CONFIG) == [0, 1]
    assert noticed_ends_s(view, CONFIG, scale) == (30.0 * scale,)
    objective = ThroughputObjective()
    planning = objective.start(tiny_gpt_profile(), CONFIG)
    seen: list[Observation] = []
    decide = planning.policy.decide

    def recording(observation: Observation) -> Decision:
        seen.append(observation)
        return decide(observation)

    planning.policy.decide = recording  # type: ignore[method-assign]
    step(PolicyInputs(view, (2, 3)), CONFIG, tiny_gpt_profile(), planning, objective)
    assert [o.noticed_ends_s for o in seen] == [(30.0 * scale,)]


def test_fit_is_the_fastest_runnable_configuration_by_brute_force():
    """``fit`` against every (D, P) of random tables: the wanted one where it runs, else one
    of the highest throughput among those that run (D <= micro-batches, P <= layers, D x P
    within the instances, feasible)."""
    import numpy as np

    from liveput.perf.types import ConfigTable

    profile = tiny_gpt_profile()
    rng = np.random.default_rng(7)
    pairs = [(d, p) for d in range(1, 7) for p in range(1, 7)]
    for _ in range(200):
        rates = rng.choice([0.5, 1.0, 2.0, 3.0], size=len(pairs)) * rng.uniform(1, 2, len(pairs))
        feasible = rng.uniform(size=len(pairs)) < 0.6
        table = ConfigTable(
            "m",
            "t",
            np.array([d for d, _ in pairs]),
            np.array([p for _, p in pairs]),
            np.where(feasible, rates, 0.0),
            np.zeros(len(pairs)),
            feasible,
            tuple(None if f else "no" for f in feasible),
        )
        config = dataclasses.replace(CONFIG, num_micro_batches=int(rng.integers(1, 7)))
        count = int(rng.integers(0, 13))
        runs = [
            (d, p, r)
            for (d, p), r, ok in zip(pairs, table.samples_per_s, feasible, strict=True)
            if ok and d * p <= count and d <= config.num_micro_batches and p <= profile.num_layers
        ]
        got = fit(None, count, table, profile, config)
        if not runs:
            assert got is None
            continue
        best_rate = max(r for _, _, r in runs)
        assert got is not None and (got.data_parallel, got.pipeline_stages, best_rate) in runs
        wanted = Configuration(*pairs[int(rng.integers(len(pairs)))])
        expected = (
            wanted
            if any((d, p) == (wanted.data_parallel, wanted.pipeline_stages) for d, p, _ in runs)
            else got
        )
        assert fit(wanted, count, table, profile, config) == expected
