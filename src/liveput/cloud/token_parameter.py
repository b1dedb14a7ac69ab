"""The job token in SSM Parameter Store while an AWS provider runs (not in the user data).

Instance user data is readable by anyone allowed ``ec2:DescribeInstanceAttribute`` in the
account; a SecureString parameter is readable only by whom IAM allows ``ssm:GetParameter`` on it
and ``kms:Decrypt`` with its key (the account's default ``aws/ssm``): the instances' role
(``docs/providers.md`` gives the policy).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from liveput.cloud.retry import ProviderError

__all__ = ["TOKEN_PARAMETER", "TokenParameter"]

TOKEN_PARAMETER = "/liveput/{job}/token"
"""SSM SecureString parameter holding a job's token while its provider runs."""


class TokenParameter:
    """One job's token parameter; ``call(operation, **kwargs)`` is one SSM call (its errors as
    :class:`ProviderError`; the provider retries)."""

    def __init__(self, job: str, token: str, call: Callable[..., dict[str, Any]]) -> None:
        self.name = TOKEN_PARAMETER.format(job=job)
        self.job = job
        self._token = token
        self._call = call
        self.written = False
        """Put by this provider and not deleted since."""

    def put(self) -> None:
        """Write the token (over a previous run's of the same job)."""
        self._call(
            "put_parameter",
            Name=self.name,
            Description=f"liveput job {self.job}: the token its agents join with",
            Value=self._token,
            Type="SecureString",  # encrypted with the account's default key, aws/ssm
            Overwrite=True,
        )
        self.written = True

    def delete(self) -> None:
        """Delete it if this provider wrote it (already gone is fine)."""
        if not self.written:
            return
        try:
            self._call("delete_parameter", Name=self.name)
        except ProviderError as error:
            if error.code != "ParameterNotFound":
                raise
        self.written = False
