"""Preemption notices from local stand-ins of the AWS and GCP metadata services and from
signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from runtime_fixtures import free_port

from liveput.errors import LiveputError
from liveput.runtime.clock import ManualClock
from liveput.runtime.notices import (
    AWS_NOTICE_LEAD_S,
    AwsNoticeWatcher,
    EmulatorNoticeWatcher,
    GcpNoticeWatcher,
    Notice,
    NoticeMonitor,
    SignalNoticeWatcher,
    write_notice_file,
)
from liveput.runtime.store import MemoryStore

NOW_ISO = "2027-01-15T08:00:00Z"
NOW_UNIX_S = datetime(2027, 1, 15, 8, 0, tzinfo=UTC).timestamp()  # the watcher's wall clock


@dataclass
class MetadataState:
    """What the fake metadata service answers, and what it was asked."""

    aws_action: str | None = None
    """Body of spot/instance-action once a notice stands (else 404)."""
    aws_token: str = "token-1"
    """The session token the service hands out and accepts."""
    imdsv2: bool = True
    """False: the token endpoint answers 405 and v1 requests are served."""
    gcp_preempted: bool = False
    """What instance/preempted says."""
    requests: list[tuple[str, str]] = field(default_factory=list)
    """(method, path) of every request."""


class MetadataHandler(BaseHTTPRequestHandler):
    """Plays AWS IMDS and the GCP metadata server, strictly enough to catch wrong requests."""

    state: MetadataState

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass

    def _reply(self, status: int, body: str = "") -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self) -> None:  # noqa: N802
        self.state.requests.append(("PUT", self.path))
        if self.path != "/latest/api/token" or not self.state.imdsv2:
            return self._reply(405)
        if not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "").isdigit():
            return self._reply(400)
        self._reply(200, self.state.aws_token)

    def do_GET(self) -> None:  # noqa: N802
        self.state.requests.append(("GET", self.path))
        if self.path == "/latest/meta-data/spot/instance-action":
            if (
                self.state.imdsv2
                and self.headers.get("X-aws-ec2-metadata-token") != self.state.aws_token
            ):
                return self._reply(401)
            if self.state.aws_action is None:
                return self._reply(404, "Not Found")
            return self._reply(200, self.state.aws_action)
        if self.path == "/computeMetadata/v1/instance/preempted":
            if self.headers.get("Metadata-Flavor") != "Google":
                return self._reply(403)
            return self._reply(200, "TRUE" if self.state.gcp_preempted else "FALSE")
        self._reply(404)


@pytest.fixture
def metadata(process_tier: None) -> Iterator[tuple[str, MetadataState]]:
    """A fake metadata service on 127.0.0.1: (endpoint URL, its state)."""
    state = MetadataState()
    handler = type("Handler", (MetadataHandler,), {"state": state})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", state
    server.shutdown()
    server.server_close()


def test_aws_notice_with_imdsv2_token(metadata: tuple[str, MetadataState]) -> None:
    endpoint, state = metadata
    watcher = AwsNoticeWatcher(endpoint, clock=ManualClock(), now_unix_s=lambda: NOW_UNIX_S)
    assert watcher.poll() is None
    assert watcher.poll() is None
    state.aws_action = json.dumps({"action": "terminate", "time": "2027-01-15T08:02:00Z"})
    notice = watcher.poll()
    assert notice == Notice("aws", "terminate", AWS_NOTICE_LEAD_S, state.aws_action)
    state.aws_action = None
    assert watcher.poll() == notice  # a notice is never withdrawn
    # One session token, reused; three instance-action reads.
    assert (
        state.requests
        == [("PUT", "/latest/api/token")] + [("GET", "/latest/meta-data/spot/instance-action")] * 3
    )


def test_aws_token_is_refreshed_when_rejected_or_expired(
    metadata: tuple[str, MetadataState],
) -> None:
    endpoint, state = metadata
    clock = ManualClock()
    watcher = AwsNoticeWatcher(
        endpoint, clock=clock, token_ttl_s=600, now_unix_s=lambda: NOW_UNIX_S
    )
    assert watcher.poll() is None
    state.aws_token = "token-2"  # the service revoked the old one: 401, then a new token
    assert watcher.poll() is None
    puts = [r for r in state.requests if r[0] == "PUT"]
    assert len(puts) == 2
    clock.advance(301)  # past half the TTL: renewed before use
    assert watcher.poll() is None
    assert len([r for r in state.requests if r[0] == "PUT"]) == 3
    state.aws_action = json.dumps({"action": "stop", "time": NOW_ISO})
    assert watcher.poll() == Notice("aws", "stop", 0.0, state.aws_action)


def test_aws_falls_back_to_imdsv1(metadata: tuple[str, MetadataState]) -> None:
    endpoint, state = metadata
    state.imdsv2 = False
    state.aws_action = json.dumps({"action": "hibernate", "time": "2027-01-15T08:00:30Z"})
    notice = AwsNoticeWatcher(endpoint, now_unix_s=lambda: NOW_UNIX_S).poll()
    assert notice is not None and (notice.action, notice.lead_s) == ("hibernate", 30.0)


def test_aws_malformed_and_unreachable_are_one_line_errors(
    metadata: tuple[str, MetadataState],
) -> None:
    endpoint, state = metadata
    state.aws_action = "{not json"
    with pytest.raises(LiveputError, match="malformed instance-action"):
        AwsNoticeWatcher(endpoint).poll()
    port = free_port()
    with pytest.raises(
        LiveputError, match=f"metadata service http://127.0.0.1:{port}/latest/api/token unreachable"
    ):
        AwsNoticeWatcher(f"http://127.0.0.1:{port}", timeout_s=0.5).poll()


def test_gcp_preempted(metadata: tuple[str, MetadataState]) -> None:
    endpoint, state = metadata
    watcher = GcpNoticeWatcher(endpoint)
    assert watcher.poll() is None
    state.gcp_preempted = True
    assert watcher.poll() == Notice("gcp", "preempted", 30.0, "TRUE")
    state.gcp_preempted = False
    assert watcher.poll() is not None
    assert state.requests == [("GET", "/computeMetadata/v1/instance/preempted")] * 2


def test_gcp_error_status_is_reported(metadata: tuple[str, MetadataState]) -> None:
    endpoint, _ = metadata
    with pytest.raises(LiveputError, match="HTTP 404"):
        GcpNoticeWatcher(endpoint + "/wrong").poll()


def test_sigterm_watcher_sees_the_signal_and_restores_the_handler() -> None:
    before = signal.getsignal(signal.SIGTERM)
    watcher = SignalNoticeWatcher()
    try:
        assert watcher.poll() is None
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 5
        while watcher.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert watcher.poll() == Notice("signal", "SIGTERM", None, "SIGTERM")
    finally:
        watcher.close()
    assert signal.getsignal(signal.SIGTERM) == before


def test_signal_watcher_refuses_other_threads() -> None:
    errors: list[Exception] = []

    def make() -> None:
        try:
            SignalNoticeWatcher()
        except LiveputError as exc:
            errors.append(exc)

    thread = threading.Thread(target=make)
    thread.start()
    thread.join()
    assert len(errors) == 1 and "main thread" in str(errors[0])


def test_emulator_notice_needs_the_file_not_just_the_signal(tmp_path: Path) -> None:
    path = tmp_path / "i-0001.notice.json"
    watcher = EmulatorNoticeWatcher(path, now_unix_s=lambda: path.stat().st_mtime)
    wake = threading.Event()
    watcher.wake = wake
    try:
        os.kill(os.getpid(), signal.SIGUSR1)  # would kill the process without the handler
        assert wake.wait(5)
        assert watcher.poll() is None  # a stray signal is not a notice
        write_notice_file(path, Notice("emulator", "terminate", 4.0, "i-0001"))
        assert watcher.poll() == Notice("emulator", "terminate", 4.0, "i-0001")
    finally:
        watcher.close()
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL


def test_an_emulator_notice_read_late_counts_its_lead_from_when_it_was_written(tmp_path):
    """An agent still importing PyTorch read the notice seconds late and reported the whole
    lead: the coordinator then aimed the checkpoint before the end (Rule 9) after the end."""
    path = tmp_path / "i-0002.notice.json"
    write_notice_file(path, Notice("emulator", "terminate", 12.0, "i-0002"))
    os.utime(path, (1000.0, 1000.0))  # written at unix second 1000
    watcher = EmulatorNoticeWatcher(path, signum=None, now_unix_s=lambda: 1003.5)
    assert watcher.poll() == Notice("emulator", "terminate", 8.5, "i-0002")
    late = EmulatorNoticeWatcher(path, signum=None, now_unix_s=lambda: 1020.0)
    assert late.poll() == Notice("emulator", "terminate", 0.0, "i-0002")


def test_emulator_notice_from_the_store() -> None:
    store = MemoryStore()
    watcher = EmulatorNoticeWatcher(None, signum=None, store=store, store_key="notices/i-0003")
    assert watcher.poll() is None
    store.set("notices/i-0003", Notice("emulator", "terminate", 1.5, "i-0003").to_json().encode())
    assert watcher.poll() == Notice("emulator", "terminate", 1.5, "i-0003")
    store.set("notices/bad", b"{]")
    with pytest.raises(
        LiveputError, match="malformed preemption notice in store key 'notices/bad'"
    ):
        EmulatorNoticeWatcher(None, signum=None, store=store, store_key="notices/bad").poll()
    with pytest.raises(LiveputError, match="needs a notice file"):
        EmulatorNoticeWatcher(None, signum=None)


@pytest.mark.process
def test_monitor_wakes_on_signal_and_survives_a_failing_source(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "notice.json"
    unreachable = AwsNoticeWatcher(f"http://127.0.0.1:{free_port()}", timeout_s=0.2)
    got: list[Notice] = []
    done = threading.Event()

    def on_notice(notice: Notice) -> None:
        got.append(notice)
        done.set()

    monitor = NoticeMonitor(
        [unreachable, EmulatorNoticeWatcher(path, now_unix_s=lambda: path.stat().st_mtime)],
        on_notice,
        interval_s=30.0,
    ).start()
    try:
        time.sleep(0.3)
        write_notice_file(path, Notice("emulator", "terminate", 2.0, "me"))
        started = time.monotonic()
        os.kill(os.getpid(), signal.SIGUSR1)
        assert done.wait(10), "the monitor did not wake on the signal"
        assert time.monotonic() - started < 5  # long before the 30 s poll interval
    finally:
        monitor.close()
    assert got == [Notice("emulator", "terminate", 2.0, "me")]
    assert monitor.notice == got[0]
    assert (
        sum("unreachable" in r.getMessage() for r in caplog.records) == 1
    )  # logged once, not per poll
    with pytest.raises(LiveputError, match="at least one"):
        NoticeMonitor([], on_notice)


CHILD = textwrap.dedent(
    """
    import sys, threading
    from liveput.runtime.notices import NoticeMonitor, SignalNoticeWatcher
    seen = threading.Event()
    monitor = NoticeMonitor([SignalNoticeWatcher()],
                            lambda n: (print(n.to_json(), flush=True), seen.set()),
                            interval_s=60)
    monitor.start()
    print("ready", flush=True)
    sys.exit(0 if seen.wait(30) else 1)
    """
)


@pytest.mark.process
def test_sigterm_to_an_agent_process_is_reported_not_fatal() -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        child.send_signal(signal.SIGTERM)
        out, _ = child.communicate(timeout=30)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == 0
    assert Notice.from_json(out.strip(), "child") == Notice("signal", "SIGTERM", None, "SIGTERM")


def _ignores_sigusr1(pid: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGUSR1 - 1) & 1)
    return False


@pytest.mark.process
def test_a_notice_signal_during_the_agents_startup_does_not_end_it() -> None:
    """A notice due at launch sent SIGUSR1 while the agent still imported torch; its
    default action ended the agent before it joined, and `liveput train` waited for minutes."""
    process = subprocess.Popen(
        [sys.executable, "-m", "liveput.runtime", "--store", f"tcp://127.0.0.1:{free_port()}"],
        env={**os.environ, "LIVEPUT_TOKEN": "t"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while (
            not _ignores_sigusr1(process.pid)
            and process.poll() is None
            and time.monotonic() < deadline
        ):
            time.sleep(0.005)
        # Before the fix the disposition stays the default (end the process) until the watcher
        # is built, seconds later, after torch loads and the store answers.
        assert _ignores_sigusr1(process.pid), "SIGUSR1 is not ignored while the agent starts"
        process.send_signal(signal.SIGUSR1)
        time.sleep(0.5)
        assert process.poll() is None, f"the agent ended with {process.returncode}"
    finally:
        process.kill()
        process.wait()


@pytest.mark.process
def test_a_notice_due_at_launch_waits_for_the_agents_watcher_instead_of_killing_it(tmp_path):
    """The emulator signals a notice the moment the process exists; SIGUSR1's default action
    ended every such agent (exit -10) before it could join, so a trace whose first preemptions
    fall within the notice lead of the start trained nothing (seen in bench peers)."""
    from liveput.cloud.processes import InstanceProcesses, command_launcher

    agent = textwrap.dedent("""
        import os, time
        from pathlib import Path
        time.sleep(0.5)  # importing torch, building the job: the notice is already there
        from liveput.runtime.notices import EmulatorNoticeWatcher
        watcher = EmulatorNoticeWatcher(Path(os.environ["LIVEPUT_NOTICE_FILE"]))
        print(watcher.poll().lead_s, flush=True)
    """)
    launcher = command_launcher([sys.executable, "-c", agent], log_dir=tmp_path)
    processes = InstanceProcesses(launcher, tmp_path)
    processes.launch("i-0000")
    processes.notice("i-0000", 12.5)  # at once, as a notice due at launch is
    code = processes._live["i-0000"].process.wait(30)
    out = (tmp_path / "i-0000.log").read_text()
    assert code == 0, out  # was -SIGUSR1
    # Read at least 0.5 s after it was written: the lead left then, not the 12.5 s written.
    assert 0.0 < float(out.split()[0]) <= 12.0, out
