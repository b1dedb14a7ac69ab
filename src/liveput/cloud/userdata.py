"""The boot script of a rented instance: install liveput, start ``liveput agent``, nothing by hand.

EC2 runs a launch template's user data as root on first boot (cloud-init). The script this module
writes, for an Amazon Linux 2023 image (the AWS provider's default):

1. installs Python 3.11 and makes a virtual environment with ``liveput`` pinned (``pip install``);
2. asks the instance metadata service (IMDSv2) for the instance's private address, which the
   other instances reach it at (``--host``);
3. exports the job token (``LIVEPUT_TOKEN``) and ``exec``s ``liveput agent`` with the
   coordinator's address (``--coordinator HOST:PORT``, its etcd) or a store URL (``--store``).

User data is readable by anyone allowed ``ec2:DescribeInstanceAttribute`` in the account, so with
``token_parameter`` set (the AWS provider always sets it) the script carries only the name of an
SSM SecureString parameter and reads the token from it at boot (``aws ssm get-parameter
--with-decryption``, with the instance's role: ``docs/providers.md`` gives its policy). Without
it the token is written into the script, for launchers whose user data only trusted people read.

:func:`parse_agent_command` reads the last two steps back out of a script, so a test (or any
launcher) can start exactly the agent an instance would start.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from liveput import __version__
from liveput.errors import LiveputError
from liveput.runtime.instance_env import MARKET_ENV

__all__ = [
    "AgentBoot",
    "AgentCommand",
    "agent_user_data",
    "parse_agent_command",
    "HOST_VARIABLE",
    "TOKEN_PARAMETER_VARIABLE",
]

HOST_VARIABLE = "LIVEPUT_HOST"
"""Shell variable the script sets to the instance's private address."""
TOKEN_PARAMETER_VARIABLE = "LIVEPUT_TOKEN_PARAMETER"
"""Variable the script exports with the name of the SSM parameter holding the token."""
_METADATA = "http://169.254.169.254/latest"


@dataclass(frozen=True)
class AgentBoot:
    """What an instance needs to join the job."""

    coordinator: str
    """``HOST:PORT`` of the coordinator's etcd (its ``--listen``), or a store URL
    (``etcd://H:P``, ``tcp://H:P``) every instance can reach."""
    token: str
    """The job token (``LIVEPUT_TOKEN``)."""
    package: str = f"liveput=={__version__}"
    """What ``pip install`` installs (a pinned version, a wheel URL, a git URL)."""
    python: str = "python3.11"
    """The Python the image's package manager installs and the environment is made with."""
    notices: str = "aws,sigterm"
    """Preemption notice sources of the agent (``--notices``)."""
    venv: str = "/opt/liveput"
    """Where the virtual environment goes on the instance."""
    token_parameter: str | None = None
    """SSM SecureString parameter the boot script reads the token from (None: the token is
    written into the script). The user data then carries only this name."""

    def __post_init__(self) -> None:
        if not self.coordinator or any(c.isspace() for c in self.coordinator):
            raise LiveputError(
                f"agent boot: coordinator address {self.coordinator!r} must be "
                "HOST:PORT or a store URL"
            )
        if not self.token or any(c.isspace() or c in "'\"\\$`" for c in self.token):
            raise LiveputError(
                "agent boot: the job token must be non-empty, without spaces, "
                "quotes, backslashes or $"
            )
        if self.token_parameter is not None and (
            not self.token_parameter.startswith("/")
            or not all(c.isalnum() or c in "/_.-" for c in self.token_parameter)
        ):
            raise LiveputError(
                f"agent boot: token parameter {self.token_parameter!r} must be an SSM name "
                "like /liveput/JOB/token (letters, digits, / _ . -)"
            )

    @property
    def is_url(self) -> bool:
        return "://" in self.coordinator

    def agent_argv(self) -> list[str]:
        """``liveput agent ...`` as the instance runs it (the host is the shell variable)."""
        where = (
            ["--store", self.coordinator] if self.is_url else ["--coordinator", self.coordinator]
        )
        return [
            f"{self.venv}/bin/liveput",
            "agent",
            *where,
            "--host",
            f"${{{HOST_VARIABLE}}}",
            "--notices",
            self.notices,
        ]


def agent_user_data(boot: AgentBoot) -> str:
    """The bash script (user data) that installs liveput and starts the agent."""
    argv = " ".join(
        shlex.quote(part) if not part.startswith("${") else f'"{part}"'
        for part in boot.agent_argv()
    )
    return "\n".join(
        [
            "#!/bin/bash",
            "# liveput agent boot (written by liveput.cloud.userdata)",
            "set -euo pipefail",
            f"dnf install -y {boot.python} {boot.python}-pip",
            f"{boot.python} -m venv {shlex.quote(boot.venv)}",
            f"{shlex.quote(boot.venv)}/bin/pip install --quiet {shlex.quote(boot.package)}",
            f'IMDS_TOKEN=$(curl -s -X PUT "{_METADATA}/api/token" '
            '-H "X-aws-ec2-metadata-token-ttl-seconds: 300")',
            f'{HOST_VARIABLE}=$(curl -s -H "X-aws-ec2-metadata-token: $IMDS_TOKEN" '
            f'"{_METADATA}/meta-data/local-ipv4")',
            # The agent registers its market (the planner spreads on-demand instances over stages).
            f'{MARKET_ENV}=$(curl -s -H "X-aws-ec2-metadata-token: $IMDS_TOKEN" '
            f'"{_METADATA}/meta-data/instance-life-cycle")',
            f'[ "${MARKET_ENV}" = on-demand ] || {MARKET_ENV}=spot',
            f"export {MARKET_ENV}",
            *_token_lines(boot),
            f"exec {argv}",
            "",
        ]
    )


def _token_lines(boot: AgentBoot) -> list[str]:
    if boot.token_parameter is None:
        return [f"export LIVEPUT_TOKEN={boot.token}"]
    return [
        f"export {TOKEN_PARAMETER_VARIABLE}={boot.token_parameter}",
        "command -v aws >/dev/null || dnf install -y awscli-2",
        f'AWS_REGION=$(curl -s -H "X-aws-ec2-metadata-token: $IMDS_TOKEN" '
        f'"{_METADATA}/meta-data/placement/region")',
        # Read with the instance's role; the value never appears in the user data.
        f'LIVEPUT_TOKEN=$(aws ssm get-parameter --region "$AWS_REGION" '
        f'--name "${TOKEN_PARAMETER_VARIABLE}" --with-decryption '
        "--query Parameter.Value --output text)",
        "export LIVEPUT_TOKEN",
    ]


@dataclass(frozen=True)
class AgentCommand:
    """The agent a boot script starts."""

    argv: list[str]
    """``liveput agent ...`` (the host still ``${LIVEPUT_HOST}``)."""
    env: dict[str, str]
    """Exported variables (``LIVEPUT_TOKEN``, or ``LIVEPUT_TOKEN_PARAMETER`` when the script
    reads the token from SSM at boot: the caller then reads it as the instance would)."""

    def resolved(self, liveput: list[str], host: str) -> list[str]:
        """The argv with ``liveput`` for the installed executable and ``host`` for the address."""
        rest = [host if part == f"${{{HOST_VARIABLE}}}" else part for part in self.argv[1:]]
        return [*liveput, *rest]


def parse_agent_command(user_data: str) -> AgentCommand:
    """The exported variables and the ``exec``'d agent command of a boot script."""
    env: dict[str, str] = {}
    argv: list[str] | None = None
    for line in user_data.splitlines():
        if line.startswith("export ") and "=" in line:  # a bare `export X` is set at boot
            name, _, value = line[len("export ") :].partition("=")
            env[name] = shlex.split(value)[0] if value else ""
        elif line.startswith("exec "):
            argv = shlex.split(line[len("exec ") :])
    if argv is None or len(argv) < 2 or argv[1] != "agent":
        raise LiveputError("user data starts no `liveput agent` (no `exec .../liveput agent` line)")
    return AgentCommand(argv, env)
