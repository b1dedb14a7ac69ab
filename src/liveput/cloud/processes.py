"""Agent processes standing in for instances: launch, notice, kill, reap.

What the emulated provider (:class:`~liveput.cloud.emulated.EmulatedProvider`) does to the
machine an instance is: start its agent through a launcher (:func:`command_launcher`), deliver a
preemption notice (a JSON notice file, an optional store key, then a signal), SIGKILL it, stop it
on release. The provider decides *when*; this module only acts.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from liveput.cloud.agent_forks import ForkServer
from liveput.errors import LiveputError
from liveput.runtime import keys
from liveput.runtime.entry import AGENT_MODULE
from liveput.runtime.instance_env import INSTANCE_ID_ENV, MARKET_ENV, NOTICE_FILE_ENV
from liveput.runtime.notices import Notice, write_notice_file
from liveput.runtime.store import Store

log = logging.getLogger(__name__)

__all__ = ["LaunchedProcess", "LaunchSpec", "Launcher", "command_launcher", "InstanceProcesses"]


@dataclass(frozen=True)
class LaunchSpec:
    """What a launcher needs to start the agent of a new instance."""

    instance_id: str
    """The new instance's id (``i-0000``, ``i-0001``, ...)."""
    notice_file: Path
    """Where the emulator will write this instance's preemption notice."""
    market: str = "spot"
    """``spot`` or ``on-demand``: the agent registers it (the planner spreads on-demand ones)."""

    @property
    def env(self) -> dict[str, str]:
        """Environment variables that tell the agent who it is, how it is rented and where its
        notice lands."""
        return {
            INSTANCE_ID_ENV: self.instance_id,
            NOTICE_FILE_ENV: str(self.notice_file),
            MARKET_ENV: self.market,
        }


class LaunchedProcess(Protocol):
    """What the emulated provider uses of an instance's process: a :class:`subprocess.Popen`,
    or an agent forked by a :class:`~liveput.cloud.agent_forks.ForkServer`."""

    pid: int

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill(self) -> None: ...

    def terminate(self) -> None: ...


Launcher = Callable[[LaunchSpec], LaunchedProcess]
"""Starts the agent process of a new instance."""


def command_launcher(
    template: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    log_dir: Path | None = None,
    fork_server: ForkServer | None = None,
) -> Launcher:
    """A launcher running ``template`` with ``{instance_id}`` and ``{notice_file}`` filled in.

    The process gets ``env`` (default: this process's environment) plus :attr:`LaunchSpec.env`;
    with ``log_dir``, its stdout and stderr go to ``log_dir/<instance_id>.log``. With
    ``fork_server``, a template that is this interpreter's lean agent (``python -m
    liveput.runtime ...``) is forked from that server instead of started anew.
    """
    if not template:
        raise LiveputError("agent command template is empty")

    lean = [sys.executable, "-m", AGENT_MODULE]
    forked = fork_server if list(template[: len(lean)]) == lean else None

    def launch(spec: LaunchSpec) -> LaunchedProcess:
        fields = {"instance_id": spec.instance_id, "notice_file": str(spec.notice_file)}
        try:
            argv = [part.format(**fields) for part in template]
        except (KeyError, IndexError, ValueError) as exc:
            raise LiveputError(
                f"agent command template {list(template)}: bad placeholder {exc}"
            ) from None
        full_env = {**(os.environ if env is None else env), **spec.env}
        if forked is not None:
            log_path = None if log_dir is None else Path(log_dir) / f"{spec.instance_id}.log"
            return forked.spawn(argv[len(lean) :], full_env, cwd, log_path)
        if log_dir is None:
            return subprocess.Popen(argv, env=full_env, cwd=cwd, stdin=subprocess.DEVNULL)
        with open(Path(log_dir) / f"{spec.instance_id}.log", "ab") as out:
            return subprocess.Popen(
                argv, env=full_env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=out
            )

    return launch


@dataclass
class _Process:
    process: LaunchedProcess
    notice_file: Path


class InstanceProcesses:
    """One agent process per live instance, started by ``launcher``."""

    def __init__(
        self,
        launcher: Launcher,
        notice_dir: Path,
        *,
        notice_signal: int | None = signal.SIGUSR1,
        store: Store | None = None,
        notice_key_prefix: str = keys.CLOUD_NOTICE.prefix,
        what: str = "emulated provider",
    ) -> None:
        self.launcher = launcher
        self.notice_dir = Path(notice_dir)
        if not self.notice_dir.is_dir():
            raise LiveputError(f"notice directory {self.notice_dir} does not exist")
        self.notice_signal = notice_signal
        self.store = store
        self.notice_key_prefix = notice_key_prefix
        self.what = what
        self._live: dict[str, _Process] = {}

    def __contains__(self, instance_id: str) -> bool:
        return instance_id in self._live

    def pids(self) -> dict[str, int]:
        """Live instances: id -> process id."""
        return {iid: p.process.pid for iid, p in self._live.items()}

    def launch(self, instance_id: str, market: str = "spot") -> int:
        """Start ``instance_id``'s agent (rented on ``market``); its pid."""
        spec = LaunchSpec(instance_id, self.notice_dir / f"{instance_id}.notice.json", market)
        spec.notice_file.unlink(missing_ok=True)
        # A notice due at launch is signalled the moment the process exists, before its
        # interpreter can even ignore the signal, whose default action ends it (every such
        # agent died with -SIGUSR1 before joining). Blocked in this thread across the launch,
        # the signal starts blocked in the child (the mask survives exec) and waits there until
        # the agent's notice watcher unblocks it.
        blocked = set() if self.notice_signal is None else {self.notice_signal}
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
        try:
            process = self.launcher(spec)
        except OSError as exc:
            raise LiveputError(f"{self.what} could not launch {instance_id}: {exc}") from None
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        self._live[instance_id] = _Process(process, spec.notice_file)
        return process.pid

    def notice(self, instance_id: str, lead_s: float) -> int:
        """Tell ``instance_id`` it goes in ``lead_s`` clock seconds; its pid."""
        entry = self._live[instance_id]
        notice = Notice("emulator", "terminate", lead_s, instance_id)
        write_notice_file(entry.notice_file, notice)
        if self.store is not None:
            self.store.set(self.notice_key_prefix + instance_id, notice.to_json().encode())
        if self.notice_signal is not None:
            try:
                os.kill(entry.process.pid, self.notice_signal)
            except ProcessLookupError:
                pass  # already gone; the kill will record it
        return entry.process.pid

    def kill(self, instance_id: str) -> tuple[int, int | None]:
        """SIGKILL ``instance_id``'s agent (a preemption); (pid, exit code if it had already
        exited)."""
        entry = self._live.pop(instance_id)
        code = entry.process.poll()
        if code is None:
            entry.process.kill()
            self._wait(instance_id, entry.process)
        return entry.process.pid, code

    def stop(self, instance_id: str, grace_s: float = 5.0) -> int:
        """SIGTERM ``instance_id``'s agent, SIGKILL it after ``grace_s`` (a release); its pid."""
        entry = self._live.pop(instance_id)
        if entry.process.poll() is None:
            entry.process.terminate()
            try:
                entry.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                entry.process.kill()
                self._wait(instance_id, entry.process)
        return entry.process.pid

    def exit_code(self, instance_id: str) -> int | None:
        """The agent's exit code if it ended by itself, else None."""
        return self._live[instance_id].process.poll()

    def forget(self, instance_id: str) -> int:
        """Drop an agent that ended by itself; its pid."""
        return self._live.pop(instance_id).process.pid

    def close(self) -> None:
        """Kill every agent still running."""
        for instance_id, entry in self._live.items():
            if entry.process.poll() is None:
                entry.process.kill()
            self._wait(instance_id, entry.process)
        self._live.clear()

    @staticmethod
    def _wait(instance_id: str, process: LaunchedProcess) -> None:
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            log.warning("instance %s (pid %d) survived SIGKILL for 10 s", instance_id, process.pid)
