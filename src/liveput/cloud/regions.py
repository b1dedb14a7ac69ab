"""AWS regions liveput knows, to refuse a misspelt ``--region`` in one line before any call.

The commercial regions as AWS listed them in 2025 (``aws ec2 describe-regions --all-regions``);
GovCloud and China regions are left out (their partitions need their own credentials anyway).
"""

from __future__ import annotations

from liveput.errors import LiveputError

__all__ = ["AWS_REGIONS", "check_region"]

AWS_REGIONS = (
    "af-south-1",
    "ap-east-1",
    "ap-east-2",
    "ap-northeast-1",
    "ap-northeast-2",
    "ap-northeast-3",
    "ap-south-1",
    "ap-south-2",
    "ap-southeast-1",
    "ap-southeast-2",
    "ap-southeast-3",
    "ap-southeast-4",
    "ap-southeast-5",
    "ap-southeast-7",
    "ca-central-1",
    "ca-west-1",
    "eu-central-1",
    "eu-central-2",
    "eu-north-1",
    "eu-south-1",
    "eu-south-2",
    "eu-west-1",
    "eu-west-2",
    "eu-west-3",
    "il-central-1",
    "me-central-1",
    "me-south-1",
    "mx-central-1",
    "sa-east-1",
    "us-east-1",
    "us-east-2",
    "us-west-1",
    "us-west-2",
)
"""Region names, sorted."""


def check_region(region: str) -> str:
    """``region`` if AWS has it, else a one-line error naming the known ones."""
    if region not in AWS_REGIONS:
        raise LiveputError(f"unknown AWS region {region!r}; known: {', '.join(AWS_REGIONS)}")
    return region
