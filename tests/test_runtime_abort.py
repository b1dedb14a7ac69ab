"""Failure semantics on a frozen or cut-off peer: survivors blocked in a collective are released
by the abort of their generation's communication (at about the heartbeat timeout), never by the
communication timeout (30 s); every step is applied exactly once; the instance that was frozen or
cut off, back again, is fenced out of its old generation and trains again in a later plan.

gloo on a frozen peer blocks the way NCCL does on a dead one. Each agent runs alone in a
network-namespace host; a cued pause (:mod:`liveput.testbed.pause`) holds one working instance
inside a step's forward pass, so its peers are surely waiting on it when the fault lands.
"""

from __future__ import annotations

import datetime
import functools
import json
import re
import signal
import time
from pathlib import Path

import pytest

from liveput.models.jobs import resolve_job
from liveput.runtime import keys, protocol
from liveput.runtime.ledger import verify_ledger
from liveput.testbed.cluster import ChaosCluster, ClusterConfig
from liveput.testbed.netns import NetnsHosts
from liveput.testbed.pause import PAUSE_DIR_ENV, PAUSING_JOB, read_paused
from liveput.testbed.reference import final_parameters, parameter_mismatches, reference_parameters

HEARTBEAT_TIMEOUT_S = 3.0
RELEASE_BOUND_S = HEARTBEAT_TIMEOUT_S + 2.0
"""The survivors must leave their collective within this long of the fault (the communication
timeout is 30 s)."""
STEPS = 40
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def _left_communication(log: str, generation: int) -> float | None:
    """Unix time of the agent's line saying it left generation ``generation``'s communication."""
    for line in log.splitlines():
        if f"generation {generation} " in line and "left its communication" in line:
            stamp = _STAMP.match(line)
            assert stamp, line
            return datetime.datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return None


def _fault_mid_step(tmp_path: Path, fault: str) -> dict:
    """Run the job, freeze (``stop``) or cut off (``partition``) the paused instance mid-step,
    undo the fault once the survivors went on; what happened, measured."""
    pause = tmp_path / "pause"
    pause.mkdir()
    config = ClusterConfig(
        steps=STEPS,
        workers=3,
        capacity=3,
        checkpoint_every=5,
        heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S,
        interval_s=1.0,
        policy="reactive",
        job=PAUSING_JOB,
        environment=((PAUSE_DIR_ENV, str(pause)),),
    )
    with NetnsHosts(3, subnet="10.78.0", gateway=True) as hosts:
        cluster = ChaosCluster(config, hosts, tmp_path / "run", tmp_path / "ckpt")
        try:
            cluster.start()

            def settled() -> bool:  # a plan of 2+ workers that has committed a few steps
                plan = cluster.plan()
                return (
                    plan is not None
                    and plan.num_working >= 2
                    and cluster.committed() >= plan.start_step + 2
                )

            assert cluster.wait_until(settled, 60.0), "no plan of 2+ workers trained"
            (pause / "arm").touch()
            assert cluster.wait_until(lambda: read_paused(pause) is not None, 20.0)
            plan = cluster.plan()
            victim = next(
                i for i, a in cluster.agents.items() if a.process.pid == read_paused(pause)["pid"]
            )
            assert plan.slots.get(victim) is not None, (victim, plan)
            survivors = [i for i, s in plan.slots.items() if s is not None and i != victim]

            fault_s = time.time()
            if fault == "stop":
                cluster.signal(victim, signal.SIGSTOP)
            else:
                hosts.set_link(cluster.agents[victim].host, up=False)

            def later_commit() -> bool:
                return any(t > fault_s for t in cluster.commit_times())

            assert cluster.wait_until(later_commit, 30.0), "no step committed after the fault"
            records = _records(cluster)
            (pause / "go").touch()
            if fault == "stop":
                cluster.signal(victim, signal.SIGCONT)
            else:
                hosts.set_link(cluster.agents[victim].host, up=True)
            assert cluster.wait_done(60.0) == 0
            records.update(_records(cluster))
            store = cluster.store
            plans = [
                protocol.load_plan(store, g)
                for g in range(plan.generation + 1, cluster.plan().generation + 1)
            ]
            logs = {i: (cluster.logs / f"agent-{i}.log").read_text() for i in cluster.agents}
            return {
                "generation": plan.generation,
                "victim": victim,
                "fault_s": fault_s,
                "released_s": {i: _left_communication(logs[i], plan.generation) for i in survivors},
                # Steps its generation committed after the fault (it was fenced: none).
                "late_steps": sorted(
                    r["step"]
                    for r in records.values()
                    if r["generation"] == plan.generation and r["committed_unix_s"] > fault_s
                ),
                "next_commit_s": min(t for t in cluster.commit_times() if t > fault_s) - fault_s,
                # A later plan it works in, that every instance arrived at: after its wake.
                "rejoined": [
                    p.generation
                    for p in plans
                    if p is not None
                    and p.slots.get(victim) is not None
                    and store.get(keys.all_arrived(p.generation)) is not None
                ],
                "ledger": verify_ledger(
                    store, resolve_job("tiny-gpt-small").global_batch_size, STEPS
                ),
                "parameters": final_parameters(tmp_path / "ckpt", plan.boundaries[-1]),
                "logs": logs,
            }
        finally:
            (pause / "go").touch()
            cluster.close()


def _records(cluster: ChaosCluster) -> dict[str, dict]:
    """The ledger's records now (read early too: the coordinator folds old ones away)."""
    return {
        key: json.loads(raw) for key, raw in cluster.store.get_prefix(keys.LEDGER.prefix).items()
    }


def _check(result: dict) -> None:
    released = {
        i: None if t is None else round(t - result["fault_s"], 2)
        for i, t in result["released_s"].items()
    }
    print(f"released after {released} s; next commit after {result['next_commit_s']:.2f} s")
    assert released and all(
        t is not None and 0 < t <= RELEASE_BOUND_S for t in released.values()
    ), (released, result["logs"])
    # The woken instance found its generation fenced: it committed nothing after the fault ...
    assert result["late_steps"] == [], result["late_steps"]
    # ... and trained again as a member of a later plan.
    assert result["rejoined"], result["logs"][result["victim"]]
    report = result["ledger"]
    assert report.exactly_once, report.problems
    assert not (mismatches := parameter_mismatches(result["parameters"], _reference())), mismatches


@functools.cache
def _reference() -> list:
    return reference_parameters(resolve_job("tiny-gpt-small"), STEPS)


@pytest.mark.process
@pytest.mark.serial
def test_a_frozen_instance_releases_its_peers_at_the_heartbeat_timeout(tmp_path):
    _check(_fault_mid_step(tmp_path, "stop"))


@pytest.mark.process
@pytest.mark.serial
def test_a_partitioned_host_releases_its_peers_at_the_heartbeat_timeout(tmp_path):
    _check(_fault_mid_step(tmp_path, "partition"))


def test_train_takes_the_heartbeat_timeout_in_wall_seconds_and_refuses_a_bad_one(capsys):
    from liveput.cli.main import main
    from liveput.errors import LiveputError
    from liveput.launch.local import LocalTrainingConfig, detection_times_s

    # Two decision intervals by default (120 s at time scale 1), the user's seconds otherwise.
    assert detection_times_s(LocalTrainingConfig(time_scale=1.0)) == (120.0, 120.0)
    assert detection_times_s(LocalTrainingConfig(time_scale=1.0, heartbeat_timeout_s=4.0)) == (
        4.0,
        120.0,
    )
    assert detection_times_s(LocalTrainingConfig(time_scale=60.0, heartbeat_timeout_s=8.0)) == (
        8.0,
        8.0,
    )
    with pytest.raises(LiveputError, match=r"^train: --heartbeat-timeout must be positive"):
        LocalTrainingConfig(heartbeat_timeout_s=0.0)
    assert main(["train", "--heartbeat-timeout", "0", "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "--heartbeat-timeout" in err and "\n" not in err
