"""Providers by name (``liveput coordinator --provider NAME``), built from one settings object.

``emulated`` replays a spot trace on this machine, starting each instance's agent as a local
process against the coordinator's store; ``aws`` rents EC2 instances whose user data starts
their agents. Without ``--provider`` the coordinator rents nothing: agents started by anything
(SkyPilot, Kubernetes, Slurm, a script) join it, and it only observes (docs/providers.md).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from liveput.cloud.provider import Provider
from liveput.cloud.userdata import AgentBoot
from liveput.errors import LiveputError
from liveput.registry import Registry
from liveput.runtime.clock import Clock, MonotonicClock
from liveput.runtime.entry import agent_command

__all__ = ["ProviderSettings", "PROVIDERS", "build_provider"]


@dataclass(frozen=True)
class ProviderSettings:
    """What a provider is built from."""

    instance_types: tuple[str, ...]
    """Instance types it may rent (``emulated`` without any: ``c5.xlarge``)."""
    boot: AgentBoot
    """Where agents find the coordinator's store, and the job token."""
    region: str = "us-east-1"
    """AWS region (``aws``)."""
    image_id: str | None = None
    """AMI (``aws``; default: the newest Amazon Linux 2023)."""
    instance_profile: str | None = None
    """IAM instance profile of the instances (``aws``): its role reads the job token from SSM
    (docs/providers.md gives the policy); required there."""
    job: str = "liveput"
    """Job name: tags and the launch template's name (``aws``)."""
    trace: str | None = None
    """Spot trace file to replay (``emulated``; default: a generated hour for ``spot_max``)."""
    spot_max: int = 1
    """Most spot instances held (sizes the generated trace)."""
    work_dir: Path = Path("liveput-provider")
    """Notices and agents' logs (``emulated``)."""
    seed: int = 0
    """Seeds the generated trace, launch delays and victims (``emulated``)."""


PROVIDERS: Registry[Callable[[ProviderSettings, Clock], Provider]] = Registry("provider")


@PROVIDERS.register("emulated")
def _emulated(settings: ProviderSettings, clock: Clock) -> Provider:
    from liveput.cloud.agent_forks import shared_fork_server
    from liveput.cloud.emulated import EmulatedProvider, EmulatedProviderConfig
    from liveput.cloud.processes import command_launcher
    from liveput.traces import generate_trace, read_trace

    # The emulator rents anything: a cheap CPU type unless told otherwise.
    config = EmulatedProviderConfig(
        instance_types=settings.instance_types or ("c5.xlarge",), seed=settings.seed
    )
    trace = (
        read_trace(settings.trace)
        if settings.trace
        else generate_trace(max(1, settings.spot_max), 1.0, settings.seed)
    )
    boot = settings.boot
    url = boot.coordinator if boot.is_url else f"etcd://{boot.coordinator}"
    notices, logs = settings.work_dir / "notices", settings.work_dir / "logs"
    try:
        notices.mkdir(parents=True, exist_ok=True)
        logs.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise LiveputError(
            f"emulated provider: cannot create {settings.work_dir}: {error.strerror}"
        ) from None
    # Its agents forked from one process that imported torch, as `liveput train`'s are.
    env = {**os.environ, "LIVEPUT_TOKEN": boot.token}
    launcher = command_launcher(
        agent_command(url), env=env, log_dir=logs, fork_server=shared_fork_server(env)
    )
    provider = EmulatedProvider(trace, clock, config, launcher=launcher, notice_dir=notices)
    provider.start_background()
    return provider


@PROVIDERS.register("aws")
def _aws(settings: ProviderSettings, clock: Clock) -> Provider:
    from liveput.cloud.aws import AwsConfig, AwsProvider

    if not settings.instance_types:
        raise LiveputError("--provider aws needs --instance-types (e.g. g4dn.xlarge,g5.xlarge)")
    config = AwsConfig(
        region=settings.region,
        instance_types=settings.instance_types,
        boot=settings.boot,
        job=settings.job,
        image_id=settings.image_id,
        iam_instance_profile=settings.instance_profile,
    )
    if not settings.instance_profile:
        raise LiveputError(
            "--provider aws needs --instance-profile NAME: the instances' role reads the job "
            "token from SSM (docs/providers.md gives its policy)"
        )
    return AwsProvider(config, clock)


def build_provider(name: str, settings: ProviderSettings, clock: Clock | None = None) -> Provider:
    """The provider registered as ``name`` (an unknown name is a one-line error)."""
    return PROVIDERS.get(name)(settings, clock or MonotonicClock())
