"""The environment a launcher gives an instance's agent: who it is, how it is rented, where its
preemption notice lands. The emulated provider and the cloud user-data scripts set these; the
agent (:mod:`liveput.runtime.launch`) reads them."""

from __future__ import annotations

import re

__all__ = ["INSTANCE_ID_ENV", "NOTICE_FILE_ENV", "MARKET_ENV", "NOTICE_SOURCES", "instance_number"]

INSTANCE_ID_ENV = "LIVEPUT_INSTANCE_ID"
"""Environment variable carrying a launched agent's instance id."""
NOTICE_FILE_ENV = "LIVEPUT_NOTICE_FILE"
"""Environment variable carrying the path where the emulator writes the agent's notice."""
MARKET_ENV = "LIVEPUT_MARKET"
"""Environment variable a provider's launch sets to the instance's market (default spot)."""
NOTICE_SOURCES = ("aws", "gcp", "sigterm", "emulator")
"""Where an agent's preemption notice may come from (its ``--notices``)."""


def instance_number(instance_id: str) -> int | None:
    """The job's instance number of an emulated provider's instance id (``i-0007``, ``e-0007``
    -> 7): the number its agent registers under. None when the id holds no digits."""
    digits = re.sub(r"\D", "", instance_id)
    return int(digits) if digits else None
