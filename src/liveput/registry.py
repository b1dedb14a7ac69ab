"""Registries of named implementations (predictors, policies, models, ...).

Dispatch by name goes through a registry, never through ``if name == ...`` chains, so adding an
implementation is one decorated class and the CLI lists what exists.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

from liveput.errors import LiveputError

T = TypeVar("T")


class Registry(Generic[T]):
    """A mapping from names to factories, with a clear error for unknown names."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator that registers ``obj`` under ``name``."""

        def decorator(obj: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._entries[name] = obj
            return obj

        return decorator

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(sorted(self._entries)) or "none"
            raise LiveputError(f"unknown {self.kind} {name!r}; known: {known}") from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


def call_spec(spec: str, expected: type[T], kind: str, builtins: Iterable[str]) -> T:
    """Call the user's ``module:function`` and check that it returns an ``expected``.

    ``builtins`` names what the user could have given instead, for the error message.
    """
    if ":" not in spec:
        raise LiveputError(
            f"unknown {kind} {spec!r}: give a built-in "
            f"({', '.join(sorted(builtins))}) or module:function"
        )
    module_name, function_name = spec.split(":", 1)
    try:
        made = getattr(importlib.import_module(module_name), function_name)()
    except (ImportError, AttributeError) as error:
        raise LiveputError(f"cannot load {kind} {spec}: {error}") from None
    if not isinstance(made, expected):
        raise LiveputError(f"{spec} must return a {expected.__module__}.{expected.__qualname__}")
    return made
