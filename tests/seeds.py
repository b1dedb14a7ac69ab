"""Seeded random cases run in a loop inside one test, not collected one test per seed."""

from __future__ import annotations

from collections.abc import Callable, Iterable


def for_each_seed(seeds: Iterable[int], check: Callable[[int], None]) -> None:
    """Run ``check(seed)`` for every seed, in order; the first failure names its seed."""
    for seed in seeds:
        try:
            check(seed)
        except AssertionError as error:
            raise AssertionError(f"seed {seed}: {error}") from error
