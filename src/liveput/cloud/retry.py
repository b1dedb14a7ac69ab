"""Exponential backoff for provider errors worth another try (throttling, capacity, quotas).

The delay before try ``k + 1`` (after ``k`` failed tries) is
``min(max_delay_s, base_delay_s * multiplier ** (k - 1))``, optionally shortened by a seeded
random fraction (``jitter``) so that many clients do not retry in lockstep. Sleeping goes through
the injected :class:`~liveput.runtime.clock.Clock`, so a test's manual clock just advances.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from liveput.errors import LiveputError

__all__ = ["ProviderError", "RetryPolicy"]


class ProviderError(Exception):
    """An error a provider's API answered with; ``retryable`` ones are tried again."""

    def __init__(self, code: str, message: str, *, retryable: bool) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = " ".join(str(message).split())
        self.retryable = retryable


@dataclass
class RetryPolicy:
    """How often and how patiently provider calls are tried again."""

    max_attempts: int = 5
    """Tries in all (1: no retry)."""
    base_delay_s: float = 1.0
    """Wait after the first failed try, seconds."""
    multiplier: float = 2.0
    """Each further wait is this many times the previous one."""
    max_delay_s: float = 30.0
    """Longest single wait, seconds."""
    jitter: float = 0.0
    """Fraction in [0, 1) of each wait drawn away at random (0: exact waits)."""
    seed: int = 0
    """Seeds the jitter."""
    _rng: random.Random = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise LiveputError(f"retry: max_attempts must be >= 1, got {self.max_attempts}")
        if not (self.base_delay_s >= 0 and self.max_delay_s >= 0 and self.multiplier >= 1):
            raise LiveputError("retry: delays must be >= 0 and the multiplier >= 1")
        if not 0 <= self.jitter < 1:
            raise LiveputError(f"retry: jitter must be in [0, 1), got {self.jitter}")
        self._rng = random.Random(self.seed)

    def delay_s(self, failed_attempts: int) -> float:
        """Wait after ``failed_attempts`` (>= 1) failed tries."""
        delay = min(self.max_delay_s, self.base_delay_s * self.multiplier ** (failed_attempts - 1))
        if self.jitter:
            delay *= 1.0 - self.jitter * self._rng.random()
        return delay
