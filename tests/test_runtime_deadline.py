"""`liveput train --deadline-hours`: the deadline policy rents on-demand instances from the
emulated provider when spot runs dry; agents it starts register as on-demand; the bill is exact."""

from __future__ import annotations

import numpy as np
import pytest

from liveput.advise.catalog import load_catalog
from liveput.cli.main import main
from liveput.runtime.deadline import DeadlineJob
from liveput.runtime.local import LocalTrainingConfig, run_local_training
from liveput.traces import Trace

STEPS = 60


def test_spot_runs_dry_and_the_deadline_policy_finishes_on_on_demand(tmp_path):
    """Two spot instances for the first two trace minutes, then none ever again: the job can
    only finish on on-demand instances, which the liveput deadline policy asks for in time."""
    trace = Trace.from_counts("dry", np.array([0.0, 120.0]), np.array([2, 0]), end_s=600.0)
    job = DeadlineJob(deadline_hours=3.0, on_demand_max=2, instance_type="p3.2xlarge")
    result = run_local_training(LocalTrainingConfig(
        model="tiny-gpt-small", workers=2, steps=STEPS, time_scale=30.0, notice_lead_s=30.0,
        checkpoint_every=5, checkpoint_dir=str(tmp_path / "ckpt"), log_dir=str(tmp_path / "logs"),
        deadline=job), trace)
    summary = result.summary()
    assert summary["exactly_once"] and summary["steps_completed"] == STEPS
    assert summary["deadline_met"] and summary["finished_hours"] <= 3.0
    assert summary["preemptions"] == 2  # both spot instances, at two minutes
    assert summary["on_demand_hours"] > 0
    price = load_catalog("aws").get("p3.2xlarge")
    # Billed exactly what ran: on-demand hours at the on-demand price, spot at the spot price.
    assert summary["usd_on_demand"] == pytest.approx(
        summary["on_demand_hours"] * price.on_demand_usd_per_hour, abs=1e-3)
    assert summary["usd_spot"] <= 2 * (120.0 / 3600.0) * price.spot_usd_per_hour + 1e-3
    assert summary["usd"] == pytest.approx(summary["usd_spot"] + summary["usd_on_demand"],
                                           abs=1e-3)
    # After the spot instances went, steps were trained by on-demand instances only.
    assert any(p["reason"] in ("interval", "recovery", "start") and p["time_s"] > 120.0 / 30.0
               for p in summary["plans"])


@pytest.mark.parametrize("args, message", [
    (["--deadline-hours", "0.001"], "shorter than the fastest possible finish"),
    (["--deadline-hours", "2", "--deadline-policy", "fastest"], "unknown deadline policy"),
    (["--deadline-hours", "2", "--instance-type", "p9.huge"], "p9.huge"),
])
def test_bad_deadline_jobs_are_one_line_errors(tmp_path, capsys, args, message):
    code = main(["train", "--model", "tiny-gpt-small", "--workers", "2", "--steps", "10",
                 "--log-dir", str(tmp_path / "logs"), *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err, err
