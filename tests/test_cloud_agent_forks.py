"""Agents forked from the fork server behave, to their launcher, as the processes ``exec`` starts:
their arguments, environment, folder and log file are their own, their exit codes and signal
deaths are reported as ``Popen`` reports them, the notice signal sent the moment one exists does
not end it, and the emulated provider's launcher forks only the lean agent's command."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from liveput.cloud.agent_forks import ForkedAgent, ForkServer, shared_fork_server
from liveput.cloud.processes import LaunchSpec, command_launcher
from liveput.runtime.entry import NOTICE_SIGNAL, agent_command

pytestmark = pytest.mark.process


@pytest.fixture
def silent_store():
    """A store address that takes connections and never answers: an agent waits there."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"tcp://127.0.0.1:{listener.getsockname()[1]}"


@pytest.fixture(scope="module")
def server():
    """The test process's shared server for its own environment (the one its in-process jobs
    use)."""
    return shared_fork_server(dict(os.environ))


def test_a_process_shares_one_server_among_environments_that_start_it_alike(tmp_path):
    # A stand-in interpreter that imports nothing: it answers nothing and runs until its input
    # closes, as a server waiting for requests does.
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\nexec cat\n")
    python.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": "/x", "LIVEPUT_TOKEN": "a"}
    first = shared_fork_server(env, str(python))
    assert first.alive
    # Another job's token and variables no start reads: the same server.
    assert shared_fork_server({**env, "LIVEPUT_TOKEN": "b", "HOME": "/h"}, str(python)) is first
    # What torch._dynamo's import and an agent's NCCL settings add: read later, not at a start.
    later = {"TORCHINDUCTOR_CACHE_DIR": "/tmp/t", "TORCH_NCCL_BLOCKING_WAIT": "1"}
    assert shared_fork_server({**env, **later}, str(python)) is first
    # Another module path, or another thread count for torch: a server of its own.
    assert shared_fork_server({**env, "PYTHONPATH": "/y"}, str(python)) is not first
    assert shared_fork_server({**env, "OMP_NUM_THREADS": "2"}, str(python)) is not first
    first.close()
    assert not first.alive
    replaced = shared_fork_server(env, str(python))
    assert replaced is not first and replaced.alive


def test_an_agent_gets_its_own_arguments_streams_and_exit_code(server, tmp_path):
    log = tmp_path / "agent.log"
    bad = server.spawn(["--store", "nowhere://x", "--no-such-option"], dict(os.environ), None, log)
    assert bad.wait(timeout=30) == 2  # argparse's exit, as `python -m liveput.runtime` gives
    assert "--no-such-option" in log.read_text()
    helped = server.spawn(["--help"], dict(os.environ), tmp_path, tmp_path / "help.log")
    assert helped.wait(timeout=30) == 0 and helped.poll() == 0
    assert "usage: python -m liveput.runtime" in (tmp_path / "help.log").read_text()


def test_a_killed_agent_reports_its_signal_and_a_notice_at_its_start_does_not_end_it(
    server, silent_store, tmp_path
):
    """The store it is given never answers, so the agent waits in its connect; the notice
    signal comes at once (a notice due at launch); it lives on until SIGKILL."""
    env = {**os.environ, "LIVEPUT_TOKEN": "t"}
    agent = server.spawn(
        ["--store", silent_store, "--notices", "sigterm"], env, tmp_path, tmp_path / "a.log"
    )
    os.kill(agent.pid, NOTICE_SIGNAL)
    with pytest.raises(subprocess.TimeoutExpired):
        agent.wait(timeout=1.0)
    assert agent.poll() is None
    agent.kill()
    assert agent.wait(timeout=10) == -signal.SIGKILL
    agent.kill()  # ended: nothing happens


def test_environment_and_folder_are_the_agents_own(silent_store, tmp_path):
    """The server runs with a job token in its environment; an agent given an environment
    without one says so and exits (its environment replaced the server's, not merged into
    it); an agent runs in the folder it was given."""
    forks = ForkServer(env={**os.environ, "LIVEPUT_TOKEN": "the-servers"}, cwd=Path("/"))
    try:
        env = {k: v for k, v in os.environ.items() if k != "LIVEPUT_TOKEN"}
        tokenless = forks.spawn(["--store", silent_store], env, tmp_path, tmp_path / "t.log")
        assert tokenless.wait(timeout=30) == 2
        assert "error: LIVEPUT_TOKEN is not set" in (tmp_path / "t.log").read_text()
        agent = forks.spawn(
            ["--store", silent_store], {**env, "LIVEPUT_TOKEN": "t"}, tmp_path, None
        )
        try:
            deadline = time.monotonic() + 10
            while Path(f"/proc/{agent.pid}/cwd").resolve() != tmp_path.resolve():
                assert time.monotonic() < deadline, "the agent never ran in its folder"
                time.sleep(0.05)
            assert agent.poll() is None  # waiting for its store, with its token
        finally:
            agent.kill()
            agent.wait(timeout=10)
    finally:
        forks.close()


def test_the_launcher_forks_the_lean_agent_only(server, silent_store, tmp_path):
    """The forked agent has a token, so it waits on its store until killed: without one it
    exited (code 2) as soon as it ran, and on a loaded machine it ran before the kill landed."""
    notice = tmp_path / "i-0.notice.json"
    forked = command_launcher(
        agent_command(silent_store),
        env={**os.environ, "LIVEPUT_TOKEN": "t"},
        log_dir=tmp_path,
        fork_server=server,
    )(LaunchSpec("i-0", notice))
    assert isinstance(forked, ForkedAgent)
    forked.kill()
    assert forked.wait(timeout=10) == -signal.SIGKILL, (tmp_path / "i-0.log").read_text()
    plain = command_launcher(["sleep", "30"], log_dir=tmp_path, fork_server=server)(
        LaunchSpec("i-1", notice)
    )
    assert isinstance(plain, subprocess.Popen)
    plain.kill()
    plain.wait(timeout=10)


def test_one_server_forks_an_agent_into_a_hosts_network_namespace(
    server, silent_store, tmp_path, netns_hosts
):
    """A test bed's hosts share one server: the agent it forks for a host runs in that host's
    network namespace (its store, on the server's loopback, is out of its reach there: it
    waits, retrying, as an agent does for a store that is not up yet)."""
    host = netns_hosts.names[1]
    env = {**os.environ, "LIVEPUT_TOKEN": "t"}
    agent = server.spawn(["--store", silent_store], env, tmp_path, tmp_path / "ns.log", host)
    try:
        wanted = os.stat(f"/var/run/netns/{host}").st_ino
        assert os.stat("/proc/self/ns/net").st_ino != wanted  # the server's is not the host's
        deadline = time.monotonic() + 10
        while os.stat(f"/proc/{agent.pid}/ns/net").st_ino != wanted:
            assert time.monotonic() < deadline, "the agent never entered the host's namespace"
            time.sleep(0.05)
        assert agent.poll() is None, (tmp_path / "ns.log").read_text()
    finally:
        agent.kill()
        agent.wait(timeout=10)
