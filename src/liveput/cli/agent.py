"""`liveput agent` (one per instance) and `liveput coordinator` (one per job), for real machines."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Annotated

import typer

from liveput.cli import params
from liveput.errors import LiveputError
from liveput.runtime.entry import CLI_NOTICES, AgentArgs, agent_main, parse_notices

if TYPE_CHECKING:
    pass


CoordinatorAddress = Annotated[
    str | None,
    typer.Option(
        "--coordinator",
        help="HOST:PORT of the coordinator's etcd (its --listen); or give --store.",
    ),
]
AgentStore = Annotated[
    str | None, typer.Option("--store", parser=params.store_url, help="Store URL (tcp/etcd).")
]
Instance = Annotated[
    int | None,
    typer.Option(
        "--instance",
        help="Instance id (default: from the emulator's environment, else assigned by the store).",
    ),
]
Host = Annotated[str, typer.Option("--host", help="Address other instances reach this one at.")]
Notices = Annotated[
    str,
    typer.Option(
        "--notices",
        help="Preemption notice sources: aws, gcp, sigterm, emulator (the default is a cloud "
        "instance's; python -m liveput.runtime, started by launchers here, has sigterm,emulator).",
    ),
]
ConnectTimeout = Annotated[
    float,
    typer.Option(
        "--connect-timeout",
        parser=params.SECONDS,
        help="Longest wait for the store and the job, seconds.",
    ),
]
AgentDevice = Annotated[
    str | None,
    typer.Option(
        "--device",
        help="Train on auto (CUDA where this instance has it), cpu, cuda or cuda:K (default: the "
        "job's --device). One agent uses one GPU.",
    ),
]


def agent(
    coordinator: CoordinatorAddress = None,
    store: AgentStore = None,
    token: params.Token = None,
    instance: Instance = None,
    host: Host = "127.0.0.1",
    notices: Notices = CLI_NOTICES,
    connect_timeout_s: ConnectTimeout = 10.0,
    device: AgentDevice = None,
) -> None:
    """Run this instance's agent: join the job, train, follow plans, leave on preemption."""
    # The same function as python -m liveput.runtime; the notice signal has been ignored since
    # this process started (liveput.cli's first lines).
    if (coordinator is None) == (store is None):
        raise LiveputError("give exactly one of --coordinator HOST:PORT and --store URL")
    parse_notices(notices)  # bad options: one line, before anything starts
    args = AgentArgs(
        store or f"etcd://{coordinator}",
        params.required_token(token),
        instance=instance,
        host=host,
        notices=notices,
        connect_timeout_s=connect_timeout_s,
        device=device,
        verbose=logging.getLogger().isEnabledFor(logging.INFO),  # liveput -v agent
    )
    code = agent_main(args)
    from liveput.runtime.comm import end_process

    end_process(code)


def register(app: typer.Typer) -> None:
    app.command("agent")(agent)
