"""Forecasts shared between predictors that are asked the same questions in the same order.

A forecasting policy asks its predictor once per interval of the history it has seen. The pools
``advise pool`` compares replay the same trace, so their policies ask the same questions, in the
same order, and each of their predictors would compute the same forecasts (four pools: each
forecast four times, three quarters of ``advise pool``'s time).

A :class:`SharedPredictor` names its sequence of questions so far by a digest (every argument of
every question, by value: each field of the history, its per-interval arrays byte by byte, the
horizon and the capacity). A forecast made for a sequence is kept under its digest; another
predictor of the same kind and options that reaches the same sequence gets that forecast and
computes nothing. A predictor keeps state (``auto`` scores its members on the history seen), so
one whose sequence reaches a digest never answered first puts the questions it skipped to its own
predictor, in order, then the new one: its every answer is the one an unshared predictor of the
same kind gives, to the bit. The forecasts are kept in memory, the least recently used dropped
past :data:`KEPT_BYTES`; a dropped one is computed again (the same way) when asked for. (A
coordinator's policy shares with nothing, and keeps at most that much of its own forecasts.)
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import OrderedDict
from typing import Any

import numpy as np

from liveput.forecast.base import PREDICTORS, Forecast, Predictor
from liveput.traces.trace import IntervalTrace

KEPT_BYTES = 64 * 2**20
"""The most memory the kept forecasts' arrays take (the 12-h default trace's 720 forecasts of a
32-instance market: 2.3 MB; of a 1024-instance one: 65 MB)."""

_Kind = tuple[str, str]
_kept: OrderedDict[tuple[_Kind, bytes], Forecast] = OrderedDict()
_kept_bytes = 0


class SharedPredictor(Predictor):
    """A ``name`` predictor (``options`` as :func:`liveput.forecast.make_predictor` takes them)
    whose forecasts are shared with every other one asked the same sequence of questions."""

    def __init__(self, name: str, **options: object) -> None:
        self._own = PREDICTORS.get(name)(**options)
        self.name = self._own.name
        self._kind: _Kind = (name, repr(sorted(options.items())))
        self._digest = b""
        # Questions answered from kept forecasts, not yet put to this predictor's own.
        self._skipped: list[tuple[IntervalTrace, int, int]] = []

    def forecast(self, history: IntervalTrace, horizon: int, capacity: int) -> Forecast:
        self._digest = _extend(self._digest, history, horizon, capacity)
        key = (self._kind, self._digest)
        kept = _kept.get(key)
        if kept is not None:
            _kept.move_to_end(key)
            self._skipped.append((history, horizon, capacity))
            return _copy(kept)
        for question in self._skipped:
            self._own.forecast(*question)
        self._skipped.clear()
        made = self._own.forecast(history, horizon, capacity)
        _keep(key, _copy(made))
        return made


def _keep(key: tuple[_Kind, bytes], forecast: Forecast) -> None:
    global _kept_bytes
    _kept[key] = forecast
    _kept_bytes += _size(forecast)
    while _kept_bytes > KEPT_BYTES and _kept:
        _kept_bytes -= _size(_kept.popitem(last=False)[1])


def _size(forecast: Forecast) -> int:
    return sum(array.nbytes for array in _arrays(forecast).values())


def _arrays(forecast: Forecast) -> dict[str, np.ndarray]:
    return {
        field.name: value
        for field in dataclasses.fields(forecast)
        if isinstance(value := getattr(forecast, field.name), np.ndarray)
    }


def _extend(digest: bytes, history: IntervalTrace, horizon: int, capacity: int) -> bytes:
    """The digest of a sequence of questions ``digest`` followed by this one."""
    hasher = hashlib.blake2b(digest, digest_size=20)
    hasher.update(repr((horizon, capacity)).encode())
    for field in dataclasses.fields(history):
        value = getattr(history, field.name)
        if isinstance(value, np.ndarray):
            hasher.update(f"{field.name}{value.dtype.str}{value.shape}".encode())
            hasher.update(np.ascontiguousarray(value).tobytes())
        else:
            hasher.update(repr((field.name, value)).encode())
    return hasher.digest()


def _copy(forecast: Forecast) -> Forecast:
    """A forecast whose arrays its caller may change without changing the kept one."""
    copies: dict[str, Any] = {name: array.copy() for name, array in _arrays(forecast).items()}
    return dataclasses.replace(forecast, **copies)
