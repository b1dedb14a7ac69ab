"""Cloud control: providers rent spot and on-demand instances for a job and bill them.

:mod:`~liveput.cloud.provider` is the contract; :mod:`~liveput.cloud.emulated` (a trace, no
account), :mod:`~liveput.cloud.aws` (EC2 through boto3) implement it; agents started by anything
else (SkyPilot, Kubernetes, Slurm) join the coordinator without a provider (docs/providers.md).
"""

from liveput.cloud.billing import Bill, BillingAccount, InstanceCharge
from liveput.cloud.emulated import EmulatedProvider, EmulatedProviderConfig, SpotModel
from liveput.cloud.provider import Provider
from liveput.cloud.retry import ProviderError, RetryPolicy
from liveput.cloud.types import (
    InstanceRecord,
    InstanceState,
    Market,
    PriceQuote,
    ProviderEvent,
    ProviderEventKind,
    RequestFailure,
    RequestResult,
)

__all__ = [
    "Bill",
    "BillingAccount",
    "InstanceCharge",
    "EmulatedProvider",
    "EmulatedProviderConfig",
    "Provider",
    "ProviderError",
    "RetryPolicy",
    "InstanceRecord",
    "InstanceState",
    "Market",
    "PriceQuote",
    "ProviderEvent",
    "ProviderEventKind",
    "RequestFailure",
    "RequestResult",
    "SpotModel",
]
