"""Instances on hosts of their own: every instance the emulated cloud starts runs in a network
namespace of :class:`~liveput.testbed.netns.NetnsHosts`, its link shaped by ``tc`` to the rate
a cloud instance's network interface would have next to its compute (``docs/peers.md``, "The
pipeline regime"). The coordinator or rendezvous store stays in the root namespace, reached on
the bridge's gateway address, as on a machine outside the cluster.

A host is free once the process last started on it has ended, so an instance that arrives after a
preemption takes the host the preempted one left (a new instance, a new link, the same address).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from liveput.cloud.processes import Launcher, LaunchSpec
from liveput.testbed.netns import NetnsHosts


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class TreePopen(subprocess.Popen):
    """A process whose :meth:`kill` SIGKILLs it and every process under it: an instance's
    processes (torchrun's workers run in their own sessions, so a process group is not enough)."""

    def kill(self) -> None:
        for pid in [self.pid, *_descendants(self.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def start_tree(
    argv: Sequence[str], env: Mapping[str, str], spec: LaunchSpec, log_dir: Path, cwd: Path
) -> TreePopen:
    """Start instance ``spec``'s process, its output in ``<log_dir>/<instance id>.log``."""
    with open(log_dir / f"{spec.instance_id}.log", "ab") as out:
        return TreePopen(
            argv,
            env={**env, **spec.env},
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
        )


SPARE_HOSTS = 2
"""Hosts beyond the trace's peak: a killed instance's processes may outlive it a moment."""


class HostPool:
    """Places each new instance on a free host of ``hosts``."""

    def __init__(self, hosts: NetnsHosts) -> None:
        self.hosts = hosts
        self._on_host: dict[int, subprocess.Popen] = {}
        self._lock = threading.Lock()

    def _free_host(self) -> int:
        for index in range(self.hosts.count):
            process = self._on_host.get(index)
            if process is None or process.poll() is not None:
                return index
        raise RuntimeError(f"all {self.hosts.count} hosts are busy")

    def launcher(
        self, template: Sequence[str], env: Mapping[str, str], log_dir: Path, cwd: Path
    ) -> Launcher:
        """A launcher that starts ``template`` (``{instance_id}`` and ``{host}``, the host's
        address, filled in) inside a free host's namespace, as a :class:`TreePopen`."""

        def launch(spec: LaunchSpec) -> subprocess.Popen:
            with self._lock:
                index = self._free_host()
                address = self.hosts.address(index)
                argv = [
                    part.format(instance_id=spec.instance_id, host=address) for part in template
                ]
                process = start_tree(self.hosts.argv(index, argv), env, spec, log_dir, cwd)
                self._on_host[index] = process
                return process

        return launch


BENCH_SUBNET = "10.78.0"
"""Not the tests' subnet: a benchmark and the suite may run on one machine at once."""


def shaped_hosts(instances: int, link_mbit: float, subnet: str = BENCH_SUBNET) -> NetnsHosts:
    """Hosts for up to ``instances`` at once, each link shaped to ``link_mbit``, with the root
    namespace on the bridge (the store's side)."""
    return NetnsHosts(instances + SPARE_HOSTS, gateway=True, link_mbit=link_mbit, subnet=subnet)
