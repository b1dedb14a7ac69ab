"""`liveput train --budget-usd / --budget-usd-per-hour`: the budget of `liveput simulate`'s
deadline jobs, on the emulated provider: it caps the on-demand instances the deadline policy
rents, the summary says what was spent against it, and a budget that makes no sense is refused
in one line before anything starts."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from liveput.cli.main import main
from liveput.cli.train import _budget_rows
from liveput.cloud.billing import Peak, peak_holding
from liveput.cloud.types import InstanceRecord, InstanceState, Market
from liveput.launch.assemble import JobRequest, assemble_job
from liveput.launch.deadline import DeadlineJob
from liveput.models.training import TrainingConfig
from liveput.perf import load_profile
from liveput.sim import SimulationConfig
from liveput.sim.deadline import simulate_deadline_policy
from liveput.traces import IntervalTrace, Trace

GPT = load_profile("gpt-1.5b")


def test_a_budget_per_hour_caps_the_on_demand_instances_trains_deadline_policy_rents():
    """The job ``liveput train`` assembles: without a budget its deadline policy rents 12
    on-demand instances to finish by the deadline; $31/h buys 10 at p3.2xlarge's $3.06 (the
    on-demand policy holds no spot)."""
    zeros = np.zeros(300, dtype=int)
    trace = IntervalTrace("flat", 60.0, np.full(300, 8), zeros, zeros)
    steps = math.ceil(400_000 / GPT.global_batch_size)
    unbounded = DeadlineJob(6.0, on_demand_max=16, instance_type="p3.2xlarge", policy="on-demand")
    request = JobRequest(
        "tiny-gpt",
        steps,
        "ckpt",
        capacity=8,
        deadline=unbounded,
        training=TrainingConfig(activation_checkpointing=True),  # as gpt-1.5b's profile
        on_demand_on_top=True,
    )

    def most_on_demand(job: DeadlineJob) -> int:
        assembled = assemble_job(
            dataclasses.replace(request, deadline=job), profile=GPT, trace=trace
        )
        assert assembled.deadline is not None
        assert assembled.deadline.objective.budget_usd_per_hour == job.budget_usd_per_hour
        config = SimulationConfig(predictor="persistence")
        run = simulate_deadline_policy(trace, GPT, "on-demand", assembled.deadline, config)
        return int(run.on_demand.max())

    assert most_on_demand(unbounded) > 10
    assert most_on_demand(dataclasses.replace(unbounded, budget_usd_per_hour=31.0)) == 10


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--budget-usd", "0"], "--budget-usd: must be in (0, "),
        (["--budget-usd", "-5"], "--budget-usd: must be in (0, "),
        (["--budget-usd-per-hour", "0"], "--budget-usd-per-hour: must be in (0, "),
        (["--budget-usd-per-hour", "-1"], "--budget-usd-per-hour: must be in (0, "),
        (["--budget-usd-per-hour", "nan"], "--budget-usd-per-hour: must be a finite number"),
        (["--budget-usd", "10"], "--budget-usd needs --deadline-hours"),
        (["--budget-usd-per-hour", "10"], "--budget-usd-per-hour needs --deadline-hours"),
        (
            ["--deadline-hours", "2", "--budget-usd", "10", "--budget-usd-per-hour", "5"],
            "give --budget-usd or --budget-usd-per-hour, not both",
        ),
        (
            ["--deadline-hours", "2", "--budget-usd-per-hour", "0.5"],
            "below the cheapest instance ($1.25/h)",
        ),
        (
            ["--deadline-hours", "2", "--budget-usd", "1"],
            "below one hour of the cheapest instance",
        ),
    ],
)
def test_a_budget_that_makes_no_sense_is_refused_in_one_line(tmp_path, capsys, args, message):
    argv = ["train", "--model", "tiny-gpt-small", "--workers", "2", "--steps", "10"]
    code = main([*argv, "--log-dir", str(tmp_path / "logs"), *args])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err, err
    assert "\n" not in err and "Traceback" not in err
    assert not (tmp_path / "logs").exists()  # refused before anything started


def _record(name: str, market: Market, launch: float | None, end: float | None, price: float):
    state = InstanceState.RUNNING if end is None else InstanceState.TERMINATED
    return InstanceRecord(name, "p3.2xlarge", market, "z", state, 0.0, price, launch, end)


def test_the_peak_counts_what_ran_at_once_and_an_end_is_not_held_with_a_start():
    spot, on_demand = Market.SPOT, Market.ON_DEMAND
    records = [
        _record("s1", spot, 0.0, 100.0, 1.0),
        _record("o1", on_demand, 10.0, 50.0, 3.0),
        _record("o2", on_demand, 50.0, None, 3.0),  # starts as o1 ends: one at a time
        _record("o3", on_demand, 60.0, 70.0, 3.0),
        _record("o4", on_demand, None, None, 3.0),  # never ran: not held, not billed
        _record("s2", spot, 200.0, None, 1.0),  # after now
    ]
    assert peak_holding(records, now_s=150.0) == Peak(on_demand=2, usd_per_hour=7.0)
    assert peak_holding(records[:2], now_s=5.0) == Peak(on_demand=0, usd_per_hour=1.0)
    assert peak_holding([], now_s=5.0) == Peak()


def test_the_table_says_what_was_spent_against_the_budget():
    base = {"usd": 2.5, "usd_per_hour_peak": 3.06, "on_demand_peak": 1}
    total = _budget_rows({**base, "budget_usd": 3.0, "within_budget": True})
    assert total == [("budget", "within: $2.50 of $3")]
    hourly = _budget_rows({**base, "budget_usd_per_hour": 2.0, "within_budget": False})
    assert hourly == [("budget per hour", "OVER: at most $3.06/h of $2/h (on-demand at once: 1)")]
    assert _budget_rows({**base, "budget_usd": None, "budget_usd_per_hour": None}) == []


@pytest.mark.process  # `liveput train`: its store server and agents
def test_train_within_a_budget_per_hour_reports_it(tmp_path, capsys):
    """No spot at all (the trace's one instance goes inside its notice lead): the job trains on
    on-demand instances only, at most one at a time within $3.50/h (p3.2xlarge: $3.06/h)."""
    trace = Trace.from_counts("dry", np.array([0.0, 20.0]), np.array([1, 0]), end_s=600.0)
    path = tmp_path / "dry.csv"
    from liveput.traces import write_trace

    write_trace(trace, path)
    code = main(
        [
            "train",
            "--model",
            "tiny-gpt-small",
            "--workers",
            "2",
            "--steps",
            "60",
            "--time-scale",
            "10",
            "--notice-lead",
            "30",
            "--trace",
            str(path),
            "--deadline-hours",
            "1",
            "--on-demand-max",
            "2",
            "--deadline-policy",
            "on-demand",
            "--budget-usd-per-hour",
            "3.5",
            "--log-dir",
            str(tmp_path / "logs"),
            "-o",
            str(tmp_path / "run.json"),
            "--json",
        ]
    )
    summary = json.loads(capsys.readouterr().out)
    assert code == 0 and summary["exactly_once"] and summary["steps_completed"] == 60
    assert summary["budget_usd_per_hour"] == 3.5 and summary["budget_usd"] is None
    assert summary["usd_spot"] == 0 and summary["on_demand_peak"] == 1
    assert summary["usd_per_hour_peak"] == pytest.approx(3.06)
    assert summary["within_budget"] is True
