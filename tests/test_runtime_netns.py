"""Agents on separate hosts: Linux network namespaces joined by a bridge, nothing on loopback;
the coordinator runs its default store, its own etcd, on its host; each agent is forked into its
host's namespace."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from runtime_cluster import TOKEN, assert_same_parameters, final_parameters, reference_parameters
from runtime_fixtures import NetnsHosts

from liveput.cloud.agent_forks import shared_fork_server

STEPS = 20
PORT = 29400


def test_agents_on_separate_hosts_train_the_same_model(tmp_path):
    env = {**os.environ, "LIVEPUT_TOKEN": TOKEN}
    with NetnsHosts(3) as hosts:
        store = f"{hosts.address(0)}:{PORT}"
        log = open(tmp_path / "host-0.log", "wb")  # noqa: SIM115
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
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        ]
        # The agents forked from this process's fork server into their hosts' namespaces, as
        # the test bed's clusters start theirs (each runs `python -m liveput.runtime`'s main).
        for index in (1, 2):
            args = ["--store", f"etcd://{store}", "--host", hosts.address(index)]
            processes.append(
                shared_fork_server(env).spawn(
                    [*args, "--instance", str(index)],
                    env,
                    None,
                    tmp_path / f"host-{index}.log",
                    hosts.names[index],
                )
            )
        try:
            codes = [process.wait(timeout=150) for process in processes]
        finally:
            for process in processes:
                if process.poll() is None:
                    process.kill()
                    process.wait(timeout=10)
            log.close()
        texts = [(tmp_path / f"host-{i}.log").read_text(errors="replace") for i in range(3)]
        assert codes == [0, 0, 0], texts
    assert "job done" in texts[0]
    assert re.search(r"plan \d+ \(\w+\): \S+ (2x1|1x2) from", texts[0]), texts[0]  # both hosts
    assert_same_parameters(
        final_parameters(tmp_path / "ckpt", 4), reference_parameters(STEPS, "tiny-gpt-small")
    )


_RECEIVE = """
import socket, sys, time
server = socket.create_server(("0.0.0.0", int(sys.argv[1])))
print("ready", flush=True)
connection, _ = server.accept()
received, first = 0, None
while chunk := connection.recv(1 << 16):
    first = first or time.monotonic()
    received += len(chunk)
print(received, time.monotonic() - first, flush=True)
"""
_SEND = """
import socket, sys
with socket.create_connection((sys.argv[1], int(sys.argv[2]))) as connection:
    connection.sendall(bytes(int(sys.argv[3])))
"""


def _transfer_mbit_per_s(hosts: NetnsHosts, size_bytes: int) -> float:
    """Megabits per second host 0 sends to host 1 (from the first byte to the last)."""
    receiver = hosts.popen(
        1, [sys.executable, "-c", _RECEIVE, str(PORT)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert receiver.stdout.readline().strip() == "ready"
        sent = hosts.run(
            0, [sys.executable, "-c", _SEND, hosts.address(1), str(PORT), str(size_bytes)]
        )
        assert sent.returncode == 0, sent.stderr
        received, seconds = receiver.communicate(timeout=60)[0].split()
    finally:
        receiver.kill()
    assert int(received) == size_bytes
    return size_bytes * 8 / 1e6 / float(seconds)


def test_a_shaped_link_carries_what_its_rate_allows():
    with NetnsHosts(2, link_mbit=40) as hosts:
        shaped = _transfer_mbit_per_s(hosts, 4_000_000)  # 0.8 s at 40 Mbit/s
        assert 0.7 * 40 < shaped < 1.1 * 40, shaped
        hosts.set_link_rate(1, 12)  # what host 1 receives, now slower than host 0 sends
        slower = _transfer_mbit_per_s(hosts, 1_500_000)
        assert 0.7 * 12 < slower < 1.1 * 12, slower
        hosts.set_link_rate(0, None)
        hosts.set_link_rate(1, None)
        assert _transfer_mbit_per_s(hosts, 40_000_000) > 5 * 40  # unshaped: the kernel's copy


def test_hosts_refuse_a_gateway_address_another_interface_holds() -> None:
    """A test bed killed before it removed itself leaves its gateway's address behind; hosts
    with the same address would send their traffic to that dead bridge, so creating them is
    refused in one line instead."""
    from liveput.testbed import TestbedError

    with NetnsHosts(1, gateway=True, subnet="10.80.0") as first:
        with pytest.raises(TestbedError, match=r"10\.80\.0\.254 is already on interface \S+gw"):
            NetnsHosts(1, gateway=True, subnet="10.80.0").create()
        assert first.run(0, ["ip", "-o", "-4", "addr", "show", "dev", "eth0"]).returncode == 0


def test_what_a_killed_bed_left_is_removed_and_its_gateway_address_taken_again() -> None:
    """A process killed while its bed stood leaves the bed's namespaces and gateway behind (a
    suite stopped by a signal): the next bed removes them, so the address is not refused."""
    made = (
        "import os, signal\n"
        "from liveput.testbed import NetnsHosts\n"
        "NetnsHosts(2, gateway=True, subnet='10.81.0').create()\n"
        "print(os.getpid(), flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    killed = subprocess.run([sys.executable, "-c", made], capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr
    tag = f"lp{killed.stdout.split()[0]}x"

    def left() -> list[str]:
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True)
        return sorted(set(re.findall(rf"\b{tag}\d+\w+", listed + links.stdout)))

    assert len(left()) == 4  # its switch, its two hosts and its gateway link
    with NetnsHosts(1, gateway=True, subnet="10.81.0") as hosts:
        assert left() == []
        holder = subprocess.run(
            ["ip", "-o", "-4", "addr", "show", "to", hosts.gateway_address],
            capture_output=True,
            text=True,
        ).stdout.split()
        assert holder[1] == f"{hosts.switch.removesuffix('sw')}gw"  # the new bed's own
