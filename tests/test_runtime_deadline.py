"""`liveput train --deadline-hours`: the deadline policy rents on-demand instances from the
emulated provider when spot runs dry; agents it starts register as on-demand; the bill is exact."""

from __future__ import annotations

import numpy as np
import pytest

from liveput.catalog import load_catalog
from liveput.cli.main import main
from liveput.launch.deadline import DeadlineJob
from liveput.launch.local import LocalTrainingConfig, run_local_training
from liveput.traces import Trace

STEPS = 100
DEADLINE_HOURS = 0.12
"""Four times the fastest finish the job's profile predicts for STEPS on a quiet machine (0.03 h:
a 90-s on-demand launch, then training): 300 steps by 0.08 h left too little room. The training
runs on the wall clock, which a busy machine slows: the test runs alone (``serial``). Replayed 20
times faster than real time, the job finished at 0.048 h (0.054 h beside three busy processes), in
10.5 s of wall where 10 times took 28 s."""


@pytest.mark.serial
def test_without_spot_the_deadline_policy_rents_on_demand_and_meets_the_deadline(tmp_path):
    """The one spot instance of the trace goes at 20 s, inside its own notice lead, so it never
    runs: the job can only train on on-demand instances, which the liveput deadline policy asks
    for at its first interval (before any plan: there is no instance to plan for)."""
    trace = Trace.from_counts("dry", np.array([0.0, 20.0]), np.array([1, 0]), end_s=600.0)
    job = DeadlineJob(deadline_hours=DEADLINE_HOURS, on_demand_max=2, instance_type="p3.2xlarge")
    result = run_local_training(
        LocalTrainingConfig(
            model="tiny-gpt-small",
            workers=2,
            steps=STEPS,
            time_scale=20.0,
            notice_lead_s=30.0,
            checkpoint_every=10,
            checkpoint_dir=str(tmp_path / "ckpt"),
            log_dir=str(tmp_path / "logs"),
            deadline=job,
            timeout_s=240.0,
        ),
        trace,
    )
    summary = result.summary()
    assert summary["exactly_once"] and summary["steps_completed"] == STEPS
    assert summary["deadline_met"] and 0 < summary["finished_hours"] <= DEADLINE_HOURS
    assert summary["preemptions"] == 0 and summary["usd_spot"] == 0
    assert summary["on_demand_hours"] > 0
    price = load_catalog("aws").get("p3.2xlarge")
    # Billed exactly what ran, from launch to release (the job's end), at the on-demand price.
    assert summary["usd_on_demand"] == pytest.approx(
        summary["on_demand_hours"] * price.on_demand_usd_per_hour, abs=1e-3
    )
    assert summary["usd"] == pytest.approx(summary["usd_on_demand"], abs=1e-3)
    assert summary["on_demand_hours"] <= 2 * summary["finished_hours"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--deadline-hours", "0.001"], "shorter than the fastest possible finish"),
        (["--deadline-hours", "2", "--deadline-policy", "fastest"], "unknown deadline policy"),
        (["--deadline-hours", "2", "--instance-type", "p9.huge"], "p9.huge"),
    ],
)
def test_bad_deadline_jobs_are_one_line_errors(tmp_path, capsys, args, message):
    code = main(
        [
            "train",
            "--model",
            "tiny-gpt-small",
            "--workers",
            "2",
            "--steps",
            "10",
            "--log-dir",
            str(tmp_path / "logs"),
            *args,
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err, err
