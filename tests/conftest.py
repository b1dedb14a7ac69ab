"""Shared test fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest
# The runtime's server fixtures (a real etcd, network-namespace hosts), shared by the test files.
from runtime_fixtures import etcd_server, etcd_url, netns_hosts  # noqa: F401

DATA = Path(__file__).resolve().parents[1] / "data"
"""The repository's committed real data (``data/README.md`` names the public sources)."""


@pytest.fixture(scope="session")
def real_traces() -> Path:
    """The folder of the real measured spot traces committed in the repository."""
    return DATA / "traces"
