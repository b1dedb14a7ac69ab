"""Agents on separate hosts: Linux network namespaces joined by a bridge, nothing on loopback;
the coordinator runs its default store, its own etcd, on its host."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from runtime_cluster import TOKEN, assert_same_parameters, final_parameters, reference_parameters
from runtime_fixtures import NetnsHosts

STEPS = 20
PORT = 29400


def test_agents_on_separate_hosts_train_the_same_model(tmp_path):
    env = {**os.environ, "LIVEPUT_TOKEN": TOKEN}
    with NetnsHosts(3) as hosts:
        store = f"{hosts.address(0)}:{PORT}"
        logs = [open(tmp_path / f"host-{i}.log", "wb") for i in range(3)]  # noqa: SIM115
        processes = [
            hosts.popen(
                0,
                [
                    sys.executable,
                    "-m",
                    "liveput.cli.main",
                    "-v",
                    "coordinator",
                    "--listen",
                    store,
                    "--etcd-dir",
                    str(tmp_path / "etcd"),
                    "--model",
                    "tiny-gpt-small",
                    "--steps",
                    str(STEPS),
                    "--workers",
                    "2",
                    "--capacity",
                    "2",
                    "--checkpoint-dir",
                    str(tmp_path / "ckpt"),
                    "--checkpoint-every",
                    "5",
                    "--interval",
                    "1",
                    "--start-grace",
                    "120",
                ],
                env=env,
                stdout=logs[0],
                stderr=subprocess.STDOUT,
            )
        ]
        for index in (1, 2):
            processes.append(
                hosts.popen(
                    index,
                    [
                        sys.executable,
                        "-m",
                        "liveput.runtime",
                        "--store",
                        f"etcd://{store}",
                        "--host",
                        hosts.address(index),
                        "--instance",
                        str(index),
                    ],
                    env=env,
                    stdout=logs[index],
                    stderr=subprocess.STDOUT,
                )
            )
        try:
            codes = [process.wait(timeout=150) for process in processes]
        finally:
            for process in processes:
                if process.poll() is None:
                    process.kill()
                    process.wait(timeout=10)
            for log in logs:
                log.close()
        texts = [(tmp_path / f"host-{i}.log").read_text(errors="replace") for i in range(3)]
        assert codes == [0, 0, 0], texts
    assert "job done" in texts[0]
    assert re.search(r"plan \d+ \(\w+\): \S+ (2x1|1x2) from", texts[0]), texts[0]  # both hosts
    assert_same_parameters(
        final_parameters(tmp_path / "ckpt", 4), reference_parameters(STEPS, "tiny-gpt-small")
    )
