"""Profiles measured on this machine, once per test process and only when a test asks.

Measuring at import time made every pytest worker pay for it while collecting, whichever tests it
then ran.
"""

from __future__ import annotations

import functools

from liveput.models.jobs import resolve_job
from liveput.perf.types import ModelProfile
from liveput.runtime.planning import profile_job


@functools.cache
def tiny_gpt_profile() -> ModelProfile:
    """tiny-gpt's layers, timed once (one repeat: the tests need its shape, not a precise rate)."""
    return profile_job(resolve_job("tiny-gpt"), repeats=1)
