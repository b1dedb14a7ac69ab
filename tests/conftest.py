"""Shared test fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED_TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    """The real measured traces that sit beside the repository (never copied into it)."""
    assert SHARED_TRACES.is_dir(), f"{SHARED_TRACES} is missing: ../shared must sit beside the repo"
    return SHARED_TRACES
