"""Shared test fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest
# The runtime's server fixtures (a real etcd, network-namespace hosts), shared by the test files.
from runtime_fixtures import etcd_server, etcd_url, netns_hosts  # noqa: F401

SHARED_TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    """The real measured traces that sit beside the repository (never copied into it)."""
    assert SHARED_TRACES.is_dir(), f"{SHARED_TRACES} is missing: ../shared must sit beside the repo"
    return SHARED_TRACES
