"""The memory a single command may ask for, and the one-line refusal when it would ask more.

Work whose size the user's input sets (tables over instance counts, intervals of a trace) is
estimated before it is allocated; beyond the budget the command refuses, naming the estimate and
what changes it, instead of growing until the machine runs out. The budget is 2 GiB unless the
environment variable ``LIVEPUT_MEMORY_GB`` raises (or lowers) it.
"""

from __future__ import annotations

import math
import os

from liveput.errors import LiveputError

DEFAULT_MEMORY_GB = 2.0
"""Budget when ``LIVEPUT_MEMORY_GB`` is not set, GiB."""


def memory_budget_bytes() -> float:
    """The budget in bytes (``LIVEPUT_MEMORY_GB``, else :data:`DEFAULT_MEMORY_GB`)."""
    raw = os.environ.get("LIVEPUT_MEMORY_GB")
    if raw is None:
        return DEFAULT_MEMORY_GB * 2**30
    try:
        value = float(raw)
    except ValueError:
        raise LiveputError(f"LIVEPUT_MEMORY_GB={raw!r} is not a number of GiB") from None
    if not math.isfinite(value) or value <= 0:
        raise LiveputError(f"LIVEPUT_MEMORY_GB={raw!r} must be a finite number of GiB > 0")
    return value * 2**30


def check_memory(what: str, needed_bytes: float, advice: str) -> None:
    """Refuse ``what`` if it needs more than the budget; ``advice`` says what needs less."""
    budget = memory_budget_bytes()
    if needed_bytes > budget:
        size = (
            f"{needed_bytes / 2**30:,.1f} GiB"
            if needed_bytes >= 0.1 * 2**30
            else f"{needed_bytes / 2**20:,.0f} MiB"
        )
        raise LiveputError(
            f"{what} needs about {size}, more than the "
            f"{budget / 2**30:g} GiB budget: {advice} (or raise "
            "LIVEPUT_MEMORY_GB)"
        )
