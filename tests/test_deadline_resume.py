"""A deadline job whose launcher (coordinator, provider and agents) is killed halfway and resumed:
the deadline and the bill count from the job's first coordinator, not from the resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from cli_support import cli, group_members, job_status, wait_for

from liveput.runtime import keys
from liveput.runtime.store import open_store

STEPS = 300
TIME_SCALE = 60.0
"""Trace seconds per wall second: the deadline's two trace hours are two wall minutes."""
DEADLINE_HOURS = 2.0


@pytest.mark.process
def test_a_deadline_job_killed_halfway_finishes_by_its_first_deadline_and_bills_on(tmp_path):
    trace = tmp_path / "spot.json"  # two spot instances for three trace hours
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": [2] * 18}))
    state = tmp_path / "state"
    job_file = tmp_path / "job.yaml"
    job_file.write_text(f"""
name: deadline-resume
model: tiny-gpt-small
steps: {STEPS}
state_dir: {state}
checkpoint: {{every: 3, keep: 2}}
provider: {{workers: 2, trace: {trace}, time_scale: {TIME_SCALE:g}, on_demand_max: 2}}
objective: {{kind: deadline, deadline_hours: {DEADLINE_HOURS:g}}}
""")
    try:
        launched = cli("launch", str(job_file), "--detach", "--json", timeout=120)
    except subprocess.TimeoutExpired:  # the launcher's own log says where it stood
        log = state / "launch.log"
        cli("stop", str(job_file))  # the launcher runs on in the background: stop the job
        raise AssertionError(
            "the job did not start in 120 s; its launcher's log ends: "
            + (log.read_text()[-3000:] if log.exists() else "(none)")
        ) from None
    assert launched.returncode == 0, launched.stderr
    place = json.loads(launched.stdout)
    token = Path(place["token_file"]).read_text().strip()
    launcher = json.loads((state / "job.json").read_text())["pid"]
    try:
        with open_store(place["store"], token=token) as store:
            # A fifth of the steps, with a checkpoint to restore from (the status lags the steps
            # by up to a decision interval, and the job would be done before the kill).
            wait_for(
                lambda: (
                    store.get("ckpt/latest") is not None
                    and json.loads(store.get(keys.status_now()) or b"{}").get("step", 0)
                    >= STEPS // 5
                ),
                120,
                f"{STEPS // 5} steps and a checkpoint",
            )
            # Read from the store, then the kill at once: the job takes seconds, and a
            # `liveput status` process here (a second or more on a loaded machine) let it finish
            # before the kill.
            kept = json.loads(store.get(keys.coordinator_deadline()))
            now = json.loads(store.get(keys.status_now()))
            at_kill, usd_status_before = now["step"], now["usd"]["total"]
            os.killpg(launcher, signal.SIGKILL)
            killed_unix_s = time.time()
        wait_for(lambda: not group_members(launcher), 10, "the launcher's group gone")
        assert kept["usd"] > 0  # the killed coordinator's provider had billed something
        resumed = cli("resume", str(job_file), "--json", timeout=240)
        ended_unix_s = time.time()
        assert resumed.returncode == 0, (at_kill, resumed.stderr[-3000:])
        summary = json.loads(resumed.stdout)
        assert summary["exactly_once"] is True and summary["steps_completed"] == STEPS
        # The deadline counts from the first coordinator: the trace hours before the kill and
        # through the break are in the finish, which is still within the original deadline.
        before_kill_h = (killed_unix_s - kept["started_unix_s"]) * TIME_SCALE / 3600.0
        until_end_h = (ended_unix_s - kept["started_unix_s"]) * TIME_SCALE / 3600.0
        assert before_kill_h < summary["finished_hours"] <= until_end_h
        assert summary["deadline_met"] is True and summary["finished_hours"] <= DEADLINE_HOURS
        # The bill goes on: what the first provider billed (as last kept) plus this one's.
        assert summary["usd_before_resume"] >= round(kept["usd"], 4) > 0
        assert summary["usd"] == pytest.approx(
            summary["usd_before_resume"] + summary["usd_spot"] + summary["usd_on_demand"],
            abs=2e-4,
        )
        assert job_status(job_file)["usd"]["total"] >= usd_status_before
    finally:
        if group_members(launcher):
            os.killpg(launcher, signal.SIGKILL)
        cli("stop", str(job_file))
