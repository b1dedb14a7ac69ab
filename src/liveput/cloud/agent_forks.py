"""Agent processes forked from one warm process, so that each does not import torch again.

An emulated instance's agent is ``python -m liveput.runtime ...`` (:func:`liveput.runtime.entry.
agent_command`). Started with ``exec``, each spends about 1.2 CPU-seconds importing torch and the
agent before it can register: a local job of four instances on two cores waits about 3 s for
them, an arrival waits for its import, and a test suite that starts hundreds of agents spends
minutes there. A :class:`ForkServer` imports them once, in a child process of its own, and forks
that process for each agent: the agent runs the same ``main`` with its own arguments,
environment, working directory and log file, and the same exit (:func:`~liveput.runtime.comm.
end_process`).

The server is single-threaded when it forks (importing torch starts no thread), so the forked
agent inherits no lock held by another thread. It inherits the server's signal dispositions:
the notice signal ignored (:func:`~liveput.runtime.entry.prepare_agent_process`, as a fresh agent
does first) until the agent's notice watcher takes it. It stays in the server's process group,
which is its launcher's: ending a launcher's group ends its agents, as with ``exec``.

Its launcher sees each agent as a :class:`ForkedAgent`, which has what the launchers use of
:class:`subprocess.Popen` (``pid``, ``poll``, ``wait``, ``kill``, ``terminate``): the server is
the agents' parent and reports each exit status to the launcher on its standard output.

An agent may be asked to run in a named network namespace (a test bed's host, :mod:`liveput.
testbed.netns`): the forked child enters it (``setns``) before it runs, so one server serves
every host of a test bed, where a server per host started inside it (``ip netns exec``) imported
torch once per host.

A process that runs several jobs (the Python API's ``run_local_training``, a test bed's
clusters) forks all their agents from one server (:func:`shared_fork_server`): it serves any
job whose environment starts it alike, since each agent gets its own environment with its
request.

Wire (one JSON object a line): the launcher writes ``{"args", "env", "cwd", "log", "netns"}``;
the server answers ``{"pid"}`` for each, in order, and ``{"exit": pid, "code": code}`` when an
agent ends (``code`` as :attr:`subprocess.Popen.returncode`: ``-N`` for signal N). The server
exits when its standard input closes; its agents run on.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import queue
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

from liveput.runtime.store.etcd_server import pid_alive

SERVER_CODE = "from liveput.cloud.agent_forks import serve; serve()"
"""The server's ``python -c`` program (not ``-m``: the package imports this module first)."""
PRELOADED = (
    "liveput.runtime.launch",
    "liveput.runtime.agent",
    "liveput.models.jobs",
    "torch._dynamo",
)
"""What an agent imports as it starts (torch among it), imported by the server before it forks.
``torch._dynamo`` too: building an optimizer imports it (``Optimizer.__init__`` is wrapped to
disable compilation), about 1.1 CPU-s in every agent at its first plan; it starts no thread."""
START_TIMEOUT_S = 120.0
"""The longest wait for the server to import and fork the first agent (a loaded machine)."""
SERVER_ENV_PREFIXES = ("PYTHON", "LD_", "OMP_", "MKL_", "KMP_", "OPENBLAS_", "TORCH", "PYTORCH_")
"""The environment variables read as the server starts and imports (the interpreter's module
path, the native libraries', torch's threads and logging): servers whose environments differ in
one of them are not shared (:func:`shared_fork_server`). Every other variable reaches an agent
through its own request, before it runs."""
SERVER_ENV_UNREAD = ("TORCHINDUCTOR_CACHE_DIR", "TORCH_NCCL_")
"""Variables of those prefixes that no start reads, left out of a server's key: importing
``torch._dynamo`` sets ``TORCHINDUCTOR_CACHE_DIR`` (to its default) in the process that imports
it, so a process's environment changes once it has built an optimizer; ``ProcessGroupNCCL`` reads
``TORCH_NCCL_*`` as it builds a group (an agent sets its own,
:func:`liveput.runtime.comm.configure_error_handling`). An agent gets both from its request."""


class ForkedAgent:
    """An agent forked by a :class:`ForkServer`, used as its launcher uses a ``Popen``."""

    def __init__(self, pid: int, server: ForkServer) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._server = server

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            code = self._server.wait_exit(self.pid, timeout)
            if code is None:
                raise subprocess.TimeoutExpired(f"agent pid {self.pid}", timeout or 0.0)
            self.returncode = code
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass  # ended since the poll: its exit is on its way

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """The launcher's side: starts the server, asks it for agents, collects their exits."""

    def __init__(
        self,
        python: str = sys.executable,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        # Its log (what it says before it forks, and its own errors) goes to the launcher's
        # standard error.
        self._process = subprocess.Popen(
            [python, "-c", SERVER_CODE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=dict(os.environ if env is None else env),
            cwd=cwd,
        )
        self._lock = threading.Lock()  # one request at a time, answered in order
        self._pids: queue.Queue[int | None] = queue.Queue()
        self._exits: dict[int, int] = {}
        self._ended = threading.Condition()
        self._gone = False
        assert self._process.stdout is not None
        self._reader = threading.Thread(
            target=self._read, args=(self._process.stdout,), name="liveput-fork-server", daemon=True
        )
        self._reader.start()

    def spawn(
        self,
        args: Sequence[str],
        env: Mapping[str, str],
        cwd: Path | None,
        log_path: Path | None,
        netns: str | None = None,
    ) -> ForkedAgent:
        """An agent running ``python -m liveput.runtime ARGS`` with ``env`` in ``cwd``, its
        standard output and error appended to ``log_path`` (None: the server's), in network
        namespace ``netns`` (a name ``ip netns`` lists; None: the server's)."""
        request = {
            "args": list(args),
            "env": dict(env),
            "cwd": str(cwd or Path.cwd()),
            "log": None if log_path is None else str(log_path),
            "netns": netns,
        }
        with self._lock:
            stdin = self._process.stdin
            assert stdin is not None
            try:
                stdin.write((json.dumps(request) + "\n").encode())
                stdin.flush()
            except (OSError, ValueError):
                raise OSError("the agents' fork server has ended") from None
            try:
                pid = self._pids.get(timeout=START_TIMEOUT_S)
            except queue.Empty:
                raise OSError(
                    f"the agents' fork server forked nothing in {START_TIMEOUT_S:g} s"
                ) from None
        if pid is None:
            raise OSError("the agents' fork server has ended")
        return ForkedAgent(pid, self)

    def exit_code(self, pid: int) -> int | None:
        with self._ended:
            return self._exit_code(pid)

    def wait_exit(self, pid: int, timeout: float | None) -> int | None:
        """``pid``'s exit code, waiting up to ``timeout`` seconds (None: as long as it runs)."""
        with self._ended:
            self._ended.wait_for(lambda: self._exit_code(pid) is not None, timeout)
            return self._exit_code(pid)

    def _exit_code(self, pid: int) -> int | None:
        code = self._exits.get(pid)
        if code is None and self._gone and not pid_alive(pid):
            return -signal.SIGKILL  # its parent, the server, is gone: nobody saw its status
        return code

    @property
    def alive(self) -> bool:
        """Whether the server still runs (it can fork another agent)."""
        return not self._gone and self._process.poll() is None

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End the server (agents still running run on: their launcher ends them)."""
        if self._process.stdin is not None:
            try:
                self._process.stdin.close()
            except OSError:
                pass
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()

    def _read(self, stdout: IO[bytes]) -> None:
        for line in stdout:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if "pid" in message:
                self._pids.put(int(message["pid"]))
            elif "exit" in message:
                with self._ended:
                    self._exits[int(message["exit"])] = int(message["code"])
                    self._ended.notify_all()
        with self._ended:
            self._gone = True
            self._ended.notify_all()
        self._pids.put(None)


_SHARED: dict[tuple[str, tuple[tuple[str, str], ...]], ForkServer] = {}
_SHARED_LOCK = threading.Lock()


def shared_fork_server(env: Mapping[str, str], python: str = sys.executable) -> ForkServer:
    """This process's fork server for agents started with ``env``: started at the first call,
    reused by the jobs this process runs after it, closed as the process exits.

    A process that runs several jobs (the Python API, a test suite, a fault campaign's runs) so
    imports torch for their agents once, not once a job (about 3 CPU-s each). Only the server's
    start reads the variables of :data:`SERVER_ENV_PREFIXES`: environments that differ there get
    servers of their own. A server that has ended is replaced."""
    read_at_start = sorted(
        (k, v)
        for k, v in env.items()
        if k.startswith(SERVER_ENV_PREFIXES) and not k.startswith(SERVER_ENV_UNREAD)
    )
    key = (python, tuple(read_at_start))
    with _SHARED_LOCK:
        server = _SHARED.get(key)
        if server is None or not server.alive:
            server = ForkServer(python, env)
            if not _SHARED:
                atexit.register(_close_shared)
            _SHARED[key] = server
        return server


def _close_shared() -> None:
    with _SHARED_LOCK:
        for server in _SHARED.values():
            server.close()
        _SHARED.clear()


# --- the server ------------------------------------------------------------------------------


def serve() -> None:
    """The server's loop: import the agent once, then fork it on each request until the
    launcher closes its input."""
    from liveput.runtime.entry import prepare_agent_process

    prepare_agent_process()  # as a fresh agent does, before torch; its forks inherit it
    # A terminal's Ctrl-C reaches the launcher's whole group: the launcher ends its agents and
    # closes this server's input, which ends it without a traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import liveput.runtime.__main__ as agent

    for module in PRELOADED:  # torch and the agent, once
        importlib.import_module(module)

    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    requests = sys.stdin.fileno()
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb", buffering=0)
    # Nothing else of the server may write where its answers go.
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    pending = b""
    while True:
        ready, _, _ = select.select([requests, wake_read], [], [])
        if wake_read in ready:
            os.read(wake_read, 4096)
        _report_exits(answers)
        if requests in ready:
            chunk = os.read(requests, 65536)
            if not chunk:
                return
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                pid = os.fork()
                if pid == 0:
                    _child(json.loads(line), agent.main, [wake_read, wake_write, answers.fileno()])
                answers.write(json.dumps({"pid": pid}).encode() + b"\n")


def _report_exits(answers: IO[bytes]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = os.waitstatus_to_exitcode(status)
        answers.write(json.dumps({"exit": pid, "code": code}).encode() + b"\n")


def _child(request: dict, main: Callable[[list[str]], int], server_fds: list[int]) -> None:
    """The forked agent: the server's pipes closed, its own streams, environment and folder,
    then the agent's ``main`` and exit, as ``python -m liveput.runtime`` runs them."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for fd in server_fds:
            os.close(fd)
        with open(os.devnull, "rb") as null:
            os.dup2(null.fileno(), 0)
        if request["log"] is not None:
            with open(request["log"], "ab") as out:
                os.dup2(out.fileno(), 1)
                os.dup2(out.fileno(), 2)
        if request.get("netns"):  # after its log is its own: a failure to enter is said there
            enter_network_namespace(request["netns"])
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = ["python -m liveput.runtime", *request["args"]]
        code = main(request["args"])
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 2)
    except BaseException:  # noqa: BLE001 - an agent's crash is its own exit, as with exec
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        from liveput.runtime.comm import end_process

        end_process(code)


CLONE_NEWNET = 0x40000000
"""``setns``'s namespace type for a network namespace (``<sched.h>``)."""


def enter_network_namespace(name: str) -> None:
    """Move this (single-threaded) process into network namespace ``name``, as ``ip netns exec``
    does before it runs a command: the sockets it opens from now on are that namespace's."""
    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        if hasattr(os, "setns"):  # Python 3.12+
            os.setns(fd, CLONE_NEWNET)
            return
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(fd, CLONE_NEWNET) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"setns into network namespace {name}: {os.strerror(error)}")
    finally:
        os.close(fd)
