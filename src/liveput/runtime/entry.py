"""The agent's process: its command line, and the one function both its entry points run.

An agent is started as ``liveput agent ...`` (the CLI) or ``python -m liveput.runtime ...`` (lean:
no CLI to import, so an emulated cloud can start many at once on a small machine). Both run
:func:`agent_main`, with the same logging, the same notice-signal handling and the same
one-line errors; every launcher builds the lean command line with :func:`agent_command`.

This module imports nothing heavy (no torch): launchers import it to build a command line, and
an entry point calls :func:`prepare_agent_process` before anything slow is imported.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from liveput.errors import LiveputError
from liveput.runtime.instance_env import NOTICE_SOURCES

AGENT_MODULE = "liveput.runtime"
"""The module ``python -m`` runs as a lean agent."""
LEAN_NOTICES = "sigterm,emulator"
"""The lean entry point's ``--notices`` default: it is started by launchers on this machine
(the emulated cloud's notice file, or SIGTERM), which never run on a cloud's instance."""
CLI_NOTICES = "aws,gcp,sigterm"
"""``liveput agent``'s ``--notices`` default: it runs on a cloud's instance (the AWS user data
starts it), where the cloud's metadata service or a SIGTERM brings the notice."""
NOTICE_SIGNAL = signal.SIGUSR1
"""The emulated cloud's notice signal (the notice file, not the signal, is the notice)."""
TORCH_CPP_LOG_LEVEL = "FATAL"
"""c10d's C++ log level in an agent: its errors (dozens of stack frames each time a heartbeat
cannot reach the store) would drown the agent's own one-line, condensed messages."""
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def prepare_agent_process() -> None:
    """What an agent process does first, before it imports torch.

    The notice signal may come while the process still imports (a notice due at launch): its
    default action would end the agent before it joins, and the job would wait for nothing.
    It is ignored until the notice watcher installs its handler."""
    signal.signal(NOTICE_SIGNAL, signal.SIG_IGN)
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", TORCH_CPP_LOG_LEVEL)


def parse_notices(text: str) -> list[str]:
    """``aws,sigterm`` -> the sources; an unknown or empty list is a one-line error."""
    sources = [s.strip() for s in text.split(",") if s.strip()]
    unknown = sorted(set(sources) - set(NOTICE_SOURCES))
    if unknown or not sources:
        raise LiveputError(
            f"--notices {text!r}: unknown source(s) {', '.join(unknown)}; "
            f"known: {', '.join(NOTICE_SOURCES)}"
        )
    return sources


def agent_command(
    store_url: str,
    *,
    notices: str = LEAN_NOTICES,
    instance: int | None = None,
    host: str | None = None,
    device: str | None = None,
    python: str = sys.executable,
) -> list[str]:
    """The lean agent's command line (the token goes in ``LIVEPUT_TOKEN``, never on it)."""
    return [
        python,
        "-m",
        AGENT_MODULE,
        *agent_args(store_url, notices=notices, instance=instance, host=host, device=device),
    ]


def agent_args(
    store_url: str,
    *,
    notices: str = LEAN_NOTICES,
    instance: int | None = None,
    host: str | None = None,
    device: str | None = None,
) -> list[str]:
    """The lean agent's arguments, after ``python -m liveput.runtime`` (a fork server's agent
    takes them alone)."""
    args = ["--store", store_url, "--notices", notices]
    if instance is not None:
        args += ["--instance", str(instance)]
    if host is not None:
        args += ["--host", host]
    if device is not None:
        args += ["--device", device]
    return args


@dataclass(frozen=True)
class AgentArgs:
    """What an agent is started with (both entry points' options)."""

    store_url: str
    """The job's store (``tcp://H:P``, ``etcd://H:P``)."""
    token: str | None
    """The job token (None: ``LIVEPUT_TOKEN``)."""
    instance: int | None = None
    """Instance id (None: from the emulator's environment, else assigned by the store)."""
    host: str = "127.0.0.1"
    """Address other instances reach this one at."""
    notices: str = LEAN_NOTICES
    """Comma-separated notice sources (:data:`NOTICE_SOURCES`)."""
    connect_timeout_s: float | None = None
    """Longest wait for the store and the job, seconds (None: the agent's store timeout)."""
    device: str | None = None
    """``auto``, ``cpu``, ``cuda`` or ``cuda:K`` (None: the job's)."""
    verbose: bool = False
    """Log every step's timings (DEBUG), else warnings and errors only."""


def agent_main(args: AgentArgs) -> int:
    """Run the agent until the job is done or the instance leaves; the exit code (2: a one-line
    error on stderr). The caller ends the process with :func:`liveput.runtime.comm.end_process`
    (no interpreter finalization under torch's threads)."""
    prepare_agent_process()  # a no-op where the entry point already did it, first thing
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING, format=LOG_FORMAT, force=True
    )
    try:
        sources = parse_notices(args.notices)
        token = args.token or os.environ.get("LIVEPUT_TOKEN")
        if not token:
            raise LiveputError("LIVEPUT_TOKEN is not set")  # liveput agent checked its --token
        from liveput.runtime.launch import run_agent

        state = run_agent(
            args.store_url,
            token,
            args.instance,
            args.host,
            sources,
            connect_timeout_s=args.connect_timeout_s,
            device=args.device,
        )
    except LiveputError as error:
        sys.stderr.write(f"error: {' '.join(str(error).split())}\n")
        return 2
    sys.stderr.write(f"agent finished: {state.value}\n")
    return 0


def wants_agent(argv: Sequence[str]) -> bool:
    """Whether the ``liveput`` command line ``argv`` (without the program) runs ``agent``: its
    first word that is not an option (the root options take no value)."""
    for word in argv:
        if not word.startswith("-"):
            return word == "agent"
    return False
