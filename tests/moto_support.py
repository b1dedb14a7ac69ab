"""moto as a real EC2 endpoint for tests, and a runner that plays the instances moto launches.

:func:`moto_endpoint` starts ``python -m moto.server`` on a free loopback port (a subprocess,
killed at the end) and waits until it answers. :class:`MotoInstanceRunner` does on this machine
what EC2 does on boot: for every instance moto reports running it reads the instance's user data
back from moto, takes the agent command out of it (:func:`parse_agent_command`), reads the job
token from the SSM parameter the script names (as the script does at boot) and starts that
agent, with this machine's ``liveput`` for the pip-installed one and 127.0.0.1 for the address
the metadata service would give; an instance that is terminated has its agent sent SIGTERM.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import urllib.request
from contextlib import AbstractContextManager
from pathlib import Path

from liveput.cloud import InstanceState
from liveput.cloud.aws import AwsProvider
from liveput.cloud.userdata import TOKEN_PARAMETER_VARIABLE, parse_agent_command
from liveput.runtime.instance_env import MARKET_ENV
from liveput.testbed.aws_endpoint import aws_endpoint, server_stacks

__all__ = ["moto_endpoint", "MotoInstanceRunner", "DUMMY_CREDENTIALS"]

DUMMY_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
}
"""What the fixture puts in the environment: boto3's standard chain finds these first."""


def moto_endpoint(log_path: Path, timeout_s: float = 30.0) -> AbstractContextManager[str]:
    """A moto server on a free loopback port; its URL (:func:`liveput.testbed.aws_endpoint`)."""
    return aws_endpoint(log_path, timeout_s=timeout_s)


def reset_moto(url: str, timeout_s: float = 5.0) -> None:
    """Forget every resource (each test starts from a fresh account). A reset takes about
    0.01 s once the server loads no public images (:func:`liveput.testbed.aws_endpoint`); with
    them, one went unanswered for 5 s in a loaded suite, making their volumes again. A reset
    that does so again fails with where each of the server's threads was then."""
    request = urllib.request.Request(f"{url}/moto-api/reset", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s):
            pass
    except OSError as error:  # urlopen's timeout: itself while reading, a URLError's reason
        if not isinstance(error, TimeoutError) and not isinstance(
            getattr(error, "reason", None), TimeoutError
        ):
            raise
        raise AssertionError(
            f"moto's reset at {url} did not answer in {timeout_s:g} s; "
            f"the server's threads then:\n{server_stacks(url)}"
        ) from None


class MotoInstanceRunner:
    """One local agent process per instance moto reports running (see the module)."""

    def __init__(self, provider: AwsProvider, log_dir: Path) -> None:
        self.provider = provider
        self.log_dir = log_dir
        self.processes: dict[str, subprocess.Popen] = {}
        self.commands: dict[str, list[str]] = {}
        self.liveput = [str(Path(sys.executable).with_name("liveput"))]

    def sync(self) -> None:
        for record in self.provider.instances():
            iid = record.instance_id
            if record.state is InstanceState.RUNNING and iid not in self.processes:
                self._boot(iid, record.market.value)
            elif record.state is InstanceState.TERMINATED and iid in self.processes:
                # The instance shuts down: its agent gets SIGTERM, as on EC2 (not waited for
                # here: the agent may leave the job gracefully, which takes coordinator ticks).
                if self.processes[iid].poll() is None:
                    self.processes[iid].terminate()

    def _boot(self, instance_id: str, market: str) -> None:
        answer = self.provider.client.describe_instance_attribute(
            InstanceId=instance_id, Attribute="userData"
        )
        script = base64.b64decode(answer["UserData"]["Value"]).decode()
        command = parse_agent_command(script)
        argv = command.resolved(self.liveput, "127.0.0.1")
        if TOKEN_PARAMETER_VARIABLE in command.env:  # the script reads the token from SSM
            ssm = self.provider.session.client(
                "ssm",
                endpoint_url=self.provider.config.endpoint_url,
                region_name=self.provider.config.region,
            )
            command.env["LIVEPUT_TOKEN"] = ssm.get_parameter(
                Name=command.env[TOKEN_PARAMETER_VARIABLE], WithDecryption=True
            )["Parameter"]["Value"]
        # The boot script reads the market from the instance metadata, which moto does not
        # serve: the runner answers for it.
        command.env[MARKET_ENV] = market
        self.commands[instance_id] = argv
        with open(self.log_dir / f"{instance_id}.log", "ab") as log:
            self.processes[instance_id] = subprocess.Popen(
                argv,
                env={**os.environ, **command.env},
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
            )

    def log(self, instance_id: str) -> str:
        return (self.log_dir / f"{instance_id}.log").read_text(errors="replace")

    def close(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)
