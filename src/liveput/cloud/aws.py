"""The AWS provider: EC2 spot and on-demand instances through boto3, each booting its agent.

Instances come from one launch template (``liveput-<job>``) whose user data
(:mod:`liveput.cloud.userdata`) installs liveput and starts ``liveput agent`` with the
coordinator's address and the job token. The token is not in the user data (anyone allowed
``ec2:DescribeInstanceAttribute`` in the account reads that): the provider puts it in SSM
Parameter Store as a SecureString, ``/liveput/<job>/token``, before it makes the template, the
boot script reads it with the instance's role, and :meth:`AwsProvider.close` deletes it.
A request is, by default, one EC2 Fleet of type
``instant`` over every (instance type, zone) pair asked as overrides: spot with the
``price-capacity-optimized`` allocation strategy, on-demand with ``lowest-price``; the fleet
answers with the instances it launched and errors for what it could not. With ``use_fleet``
off, a request is ``run_instances`` (spot through ``InstanceMarketOptions``) tried pair by pair.

Credentials come only from boto3's standard chain (environment, shared files, SSO, instance or
container role); ``endpoint_url`` points the client elsewhere (moto in tests). botocore's own
retries are off: :class:`~liveput.cloud.provider.Provider` retries throttling
(``RequestLimitExceeded``), capacity (``InsufficientInstanceCapacity``) and quota errors with
its backoff, and reports each try.

Times are the injected clock's seconds since the provider was made; an instance's bill runs
from its ``LaunchTime`` as EC2 reports it (AWS bills from there, not from when this provider
first saw it running: a listing may come minutes later), to when this provider released it or
saw it gone (a spot interruption). Spot prices come from ``describe_spot_price_history``
(newest per zone, when the instance is granted), on-demand prices from the catalog (EC2's API
has none).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from liveput.catalog import Catalog, load_catalog
from liveput.cloud.aws_template import (
    ensure_launch_template,
    launch_template_data,
    newest_spot_prices,
)
from liveput.cloud.provider import Provider
from liveput.cloud.regions import check_region
from liveput.cloud.retry import ProviderError, RetryPolicy
from liveput.cloud.token_parameter import TokenParameter
from liveput.cloud.types import InstanceRecord, InstanceState, Market, PriceQuote, ProviderEvent
from liveput.cloud.userdata import AgentBoot
from liveput.errors import LiveputError
from liveput.runtime.clock import Clock, MonotonicClock

log = logging.getLogger(__name__)

__all__ = ["AwsConfig", "AwsProvider", "RETRYABLE_CODES", "DEFAULT_IMAGE_PARAMETER"]

RETRYABLE_CODES = frozenset(
    {
        "RequestLimitExceeded",
        "Throttling",
        "ThrottlingException",  # throttling
        "InsufficientInstanceCapacity",
        "InsufficientCapacity",
        "InsufficientHostCapacity",
        "SpotMaxPriceTooLow",
        "UnfulfillableCapacity",  # capacity
        "VcpuLimitExceeded",
        "MaxSpotInstanceCountExceeded",
        "InstanceLimitExceeded",  # quotas
        "InternalError",
        "ServiceUnavailable",
        "Unavailable",
        "EndpointConnectionError",
    }
)
"""EC2 error codes tried again with backoff (quotas too: other jobs may release vCPUs)."""

DEFAULT_IMAGE_PARAMETER = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64"
"""SSM public parameter naming the newest Amazon Linux 2023 image (the default image)."""

JOB_TAG = "liveput-job"
_GONE = {"shutting-down", "terminated", "stopping", "stopped"}


@dataclass(frozen=True)
class AwsConfig:
    """Where and what the AWS provider rents."""

    region: str
    """AWS region, e.g. ``us-east-1`` (checked against the known regions)."""
    instance_types: tuple[str, ...]
    """Instance types it may rent (each must be in ``catalog``, for its on-demand price)."""
    boot: AgentBoot
    """How instances reach the coordinator (its address and the job token)."""
    job: str = "liveput"
    """Job name: tags every instance (``liveput-job``) and names the launch template."""
    image_id: str | None = None
    """AMI (default: the newest Amazon Linux 2023, from SSM ``DEFAULT_IMAGE_PARAMETER``)."""
    subnets: dict[str, str] = field(default_factory=dict)
    """Zone -> subnet id (default: the region's default subnet of each zone)."""
    security_group_ids: tuple[str, ...] = ()
    """Security groups of the instances (they must reach the coordinator and each other)."""
    key_name: str | None = None
    """SSH key pair name, if any."""
    iam_instance_profile: str | None = None
    """Instance profile name: its role must read the token parameter (``docs/providers.md``),
    and may hold a checkpoint bucket's credentials."""
    use_fleet: bool = True
    """EC2 Fleet ``instant`` requests (else ``run_instances``)."""
    endpoint_url: str | None = None
    """Another EC2 endpoint (moto); also used for SSM."""
    catalog: str = "aws"
    """Built-in catalog or catalog file: on-demand prices, the known instance types."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    """Backoff of throttling, capacity and quota errors."""

    def __post_init__(self) -> None:
        check_region(self.region)
        if not self.instance_types:
            raise LiveputError("aws: give at least one instance type")
        if not self.job or not all(c.isalnum() or c in "-_" for c in self.job):
            raise LiveputError(f"aws: job name {self.job!r} must be letters, digits, - or _")


class AwsProvider(Provider):
    """EC2 through boto3 (see the module)."""

    name = "aws"

    def __init__(
        self,
        config: AwsConfig,
        clock: Clock | None = None,
        *,
        session: Any = None,
        now_utc: Callable[[], dt.datetime] | None = None,
        on_event: Callable[[ProviderEvent], None] | None = None,
    ) -> None:
        super().__init__(clock or MonotonicClock(), config.retry, on_event)
        self.config = config
        self.catalog: Catalog = load_catalog(config.catalog).subset(list(config.instance_types))
        self._now_utc = now_utc or (lambda: dt.datetime.now(dt.UTC))
        if session is None:
            import boto3

            session = boto3.Session(region_name=config.region)
        if session.get_credentials() is None:
            raise LiveputError(
                "aws: no AWS credentials found (environment, shared config, SSO or instance role)"
            )
        from botocore.config import Config

        # One try per call: the provider's backoff retries, and reports every try.
        client_config = Config(
            region_name=config.region, retries={"max_attempts": 1, "mode": "standard"}
        )
        self.session = session
        self.client = session.client("ec2", endpoint_url=config.endpoint_url, config=client_config)
        self._ssm: Callable[[], Any] = lambda: session.client(
            "ssm", endpoint_url=config.endpoint_url, config=client_config
        )
        self._start_s = self.clock.now_s()
        self._start_utc = self._now_utc()
        self._token = TokenParameter(
            config.job,
            config.boot.token,
            lambda operation, **kwargs: self._call(operation, client=self._ssm(), **kwargs),
        )
        self._known: dict[str, InstanceRecord] = {}
        self._released: set[str] = set()
        self._subnets = dict(config.subnets) or None
        self._template_id: str | None = None

    # -- setup -------------------------------------------------------------------------------

    def now_s(self) -> float:
        return self.clock.now_s() - self._start_s

    @property
    def instance_types(self) -> tuple[str, ...]:
        return self.config.instance_types

    @property
    def zones(self) -> tuple[str, ...]:
        return tuple(self.subnets)

    @property
    def subnets(self) -> dict[str, str]:
        """Zone -> subnet id (discovered once: the region's default subnets)."""
        if self._subnets is None:
            found = self._retrying(
                lambda: self._call(
                    "describe_subnets", Filters=[{"Name": "default-for-az", "Values": ["true"]}]
                ),
                "describe subnets",
            )
            self._subnets = {
                s["AvailabilityZone"]: s["SubnetId"]
                for s in sorted(found["Subnets"], key=lambda s: s["AvailabilityZone"])
            }
            if not self._subnets:
                raise LiveputError(
                    f"aws: region {self.config.region} has no default subnets; "
                    "give the subnets to use"
                )
        return self._subnets

    def launch_template_id(self) -> str:
        """The job's launch template (made, or given a new version with the current user data)."""
        if self._template_id is None:
            self._template_id = self._retrying(self._ensure_template, "launch template")
        return self._template_id

    @property
    def token_parameter(self) -> str:
        """The SSM parameter the job token is in while this provider runs."""
        return self._token.name

    def close(self) -> None:
        """Delete the token's parameter (an instance booting after cannot join)."""
        self._retrying(self._token.delete, "delete the token parameter")

    def _ensure_template(self) -> str:
        self._token.put()
        if not self.config.iam_instance_profile:
            log.warning(
                "aws: no instance profile: the instances cannot read the job token from %s "
                "(give one allowed ssm:GetParameter on it, docs/providers.md)",
                self._token.name,
            )
        data = launch_template_data(
            dataclasses.replace(self.config.boot, token_parameter=self._token.name),
            self.config.image_id or self._default_image(),
            self._tags(),
            self.config.security_group_ids,
            self.config.key_name,
            self.config.iam_instance_profile,
        )
        return ensure_launch_template(self._call, f"liveput-{self.config.job}", data)

    def _default_image(self) -> str:
        answer = self._call("get_parameter", client=self._ssm(), Name=DEFAULT_IMAGE_PARAMETER)
        return answer["Parameter"]["Value"]

    def _tags(self, market: Market | None = None) -> list[dict[str, str]]:
        tags = [{"Key": JOB_TAG, "Value": self.config.job}]
        if market is not None:
            tags.append({"Key": "liveput-market", "Value": market.value})
        return tags

    # -- one try of each call ----------------------------------------------------------------

    def _call(self, operation: str, client: Any = None, **kwargs: Any) -> dict[str, Any]:
        """One EC2 call (or one on ``client``); its errors as :class:`ProviderError`."""
        from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

        try:
            return getattr(client or self.client, operation)(**kwargs)
        except ClientError as error:
            info = error.response.get("Error", {})
            code = str(info.get("Code", "Unknown"))
            raise ProviderError(
                code, str(info.get("Message", error)), retryable=code in RETRYABLE_CODES
            ) from None
        except EndpointConnectionError as error:
            raise ProviderError("EndpointConnectionError", str(error), retryable=True) from None
        except NoCredentialsError:
            raise LiveputError(
                "aws: no AWS credentials found (environment, shared config, SSO or instance role)"
            ) from None

    def _grant(
        self, count: int, instance_types: tuple[str, ...], market: Market, zones: tuple[str, ...]
    ) -> tuple[list[InstanceRecord], ProviderError | None]:
        template = self.launch_template_id()
        pairs = [(name, zone) for name in instance_types for zone in zones]
        if self.config.use_fleet:
            launched, error = self._fleet(count, template, pairs, market)
        else:
            launched, error = self._run_instances(count, template, pairs, market)
        now = self.now_s()
        records = []
        prices: dict[tuple[str, str], float] = {}
        for instance_id, name, zone in launched:
            if (name, zone) not in prices:
                prices[name, zone] = self._price(name, zone, market)
            record = InstanceRecord(
                instance_id, name, market, zone, InstanceState.PENDING, now, prices[name, zone]
            )
            self._known[instance_id] = record  # every instance launched is listed and billed
            records.append(record)
        if len(records) > count:  # launched beyond the ask (fleet weights): give them back
            extra = [record.instance_id for record in records[count:]]
            log.warning(
                "aws: %d instance(s) launched beyond the %d asked: %s",
                len(extra),
                count,
                ", ".join(extra),
            )
            try:
                self._terminate(extra)
            except ProviderError as error:  # listed alive: a holder releases them later
                log.warning("aws: could not terminate %s: %s", ", ".join(extra), error)
        return records[:count], error

    def _fleet(
        self, count: int, template: str, pairs: list[tuple[str, str]], market: Market
    ) -> tuple[list[tuple[str, str, str]], ProviderError | None]:
        capacity: dict[str, Any] = {
            "TotalTargetCapacity": count,
            "DefaultTargetCapacityType": market.value,
        }
        options: dict[str, Any] = {}
        if market is Market.SPOT:
            capacity["SpotTargetCapacity"] = count
            options["SpotOptions"] = {"AllocationStrategy": "price-capacity-optimized"}
        else:
            capacity["OnDemandTargetCapacity"] = count
            options["OnDemandOptions"] = {"AllocationStrategy": "lowest-price"}
        answer = self._call(
            "create_fleet",
            Type="instant",
            TargetCapacitySpecification=capacity,
            LaunchTemplateConfigs=[
                {
                    "LaunchTemplateSpecification": {
                        "LaunchTemplateId": template,
                        "Version": "$Default",
                    },
                    "Overrides": [
                        {"InstanceType": name, "SubnetId": self.subnets[zone]}
                        for name, zone in pairs
                    ],
                }
            ],
            TagSpecifications=[{"ResourceType": "instance", "Tags": self._tags(market)}],
            **options,
        )
        zone_of = {subnet: zone for zone, subnet in self.subnets.items()}
        launched = []
        for group in answer.get("Instances", []):
            override = group.get("LaunchTemplateAndOverrides", {}).get("Overrides", {})
            zone = zone_of.get(override.get("SubnetId", ""), override.get("AvailabilityZone", ""))
            for instance_id in group.get("InstanceIds", []):
                launched.append((instance_id, group.get("InstanceType", pairs[0][0]), zone))
        errors = answer.get("Errors", [])
        error = None
        if errors:
            codes = sorted({e.get("ErrorCode", "Unknown") for e in errors})
            code = next((c for c in codes if c in RETRYABLE_CODES), codes[0])
            message = next(e.get("ErrorMessage", "") for e in errors if e.get("ErrorCode") == code)
            error = ProviderError(code, message, retryable=code in RETRYABLE_CODES)
        return launched, error

    def _run_instances(
        self, count: int, template: str, pairs: list[tuple[str, str]], market: Market
    ) -> tuple[list[tuple[str, str, str]], ProviderError | None]:
        """All ``count`` from the first (type, zone) pair that has them (MinCount = MaxCount)."""
        error: ProviderError | None = None
        for name, zone in pairs:
            extra: dict[str, Any] = {}
            if market is Market.SPOT:
                extra["InstanceMarketOptions"] = {
                    "MarketType": "spot",
                    "SpotOptions": {
                        "SpotInstanceType": "one-time",
                        "InstanceInterruptionBehavior": "terminate",
                    },
                }
            try:
                answer = self._call(
                    "run_instances",
                    MinCount=count,
                    MaxCount=count,
                    InstanceType=name,
                    SubnetId=self.subnets[zone],
                    LaunchTemplate={"LaunchTemplateId": template, "Version": "$Default"},
                    TagSpecifications=[{"ResourceType": "instance", "Tags": self._tags(market)}],
                    **extra,
                )
            except ProviderError as raised:
                if not raised.retryable:
                    raise
                error = raised
                continue
            return [(i["InstanceId"], name, zone) for i in answer["Instances"]], None
        return [], error

    def _price(self, name: str, zone: str, market: Market) -> float:
        spec = self.catalog.get(name)
        if market is Market.ON_DEMAND:
            return spec.on_demand_usd_per_hour
        try:
            quotes = self._quote(name, (zone,))
        except ProviderError as error:  # the catalog's estimate rather than no instance
            log.warning("aws: spot price of %s in %s: %s; using the catalog's", name, zone, error)
            return spec.spot_usd_per_hour
        return quotes[0].spot_usd_per_hour

    def _terminate(self, instance_ids: list[str]) -> None:
        self._call("terminate_instances", InstanceIds=instance_ids)
        now = self.now_s()
        for instance_id in instance_ids:
            self._released.add(instance_id)
            self._known[instance_id] = dataclasses.replace(
                self._known[instance_id], state=InstanceState.TERMINATED, end_s=now
            )

    def _list(self) -> list[InstanceRecord]:
        alive = [iid for iid, r in self._known.items() if r.end_s is None]
        now = self.now_s()
        for chunk in _chunks(alive, 500):
            answer = self._call("describe_instances", InstanceIds=chunk)
            for reservation in answer.get("Reservations", []):
                for instance in reservation.get("Instances", []):
                    self._observe(instance, now)
        return list(self._known.values())

    def _observe(self, instance: dict[str, Any], now: float) -> None:
        record = self._known.get(instance["InstanceId"])
        if record is None or record.end_s is not None:
            return
        state = instance["State"]["Name"]
        zone = instance.get("Placement", {}).get("AvailabilityZone", record.zone)
        if state == "running" and record.launch_s is None:
            record = dataclasses.replace(
                record,
                state=InstanceState.RUNNING,
                launch_s=self._launch_s(instance.get("LaunchTime"), record, now),
                zone=zone,
            )
        elif state in _GONE:
            # Gone without a release: the cloud took it (a spot interruption).
            record = dataclasses.replace(
                record,
                state=InstanceState.TERMINATED,
                end_s=now,
                preempted=record.instance_id not in self._released,
            )
        self._known[record.instance_id] = record

    def _launch_s(self, launch_time: Any, record: InstanceRecord, now: float) -> float:
        """``LaunchTime`` on this provider's clock; within [granted, now]: EC2 gives whole
        seconds, and the two clocks may disagree by a little."""
        if not isinstance(launch_time, dt.datetime):
            return now
        if launch_time.tzinfo is None:
            launch_time = launch_time.replace(tzinfo=dt.UTC)
        since_start_s = (launch_time - self._start_utc).total_seconds()
        return min(now, max(record.requested_s, since_start_s))

    def _quote(self, instance_type: str, zones: tuple[str, ...]) -> list[PriceQuote]:
        spec = self.catalog.get(instance_type)
        now = self._now_utc()
        answer = self._call(
            "describe_spot_price_history",
            InstanceTypes=[instance_type],
            ProductDescriptions=["Linux/UNIX", "Linux/UNIX (Amazon VPC)"],
            StartTime=now,
            EndTime=now,
        )
        newest = newest_spot_prices(answer, zones)
        return [
            PriceQuote(
                instance_type,
                zone,
                newest.get(zone, spec.spot_usd_per_hour),
                spec.on_demand_usd_per_hour,
            )
            for zone in zones
        ]


def _chunks(items: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
