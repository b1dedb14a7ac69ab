"""Shared forecasts (``forecast.shared``): every answer is an unshared predictor's, to the bit,
and a predictor asked questions already answered computes nothing."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest

from liveput.forecast import make_predictor, shared
from liveput.forecast.base import Forecast
from liveput.forecast.persistence import PersistencePredictor
from liveput.forecast.shared import SharedPredictor
from liveput.traces import IntervalTrace, generate_trace


@pytest.fixture(autouse=True)
def nothing_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared, "_kept", OrderedDict())
    monkeypatch.setattr(shared, "_kept_bytes", 0)


Question = tuple[IntervalTrace, int, int]


def _questions(trace: IntervalTrace, capacity: int = 40, start: int = 1) -> list[Question]:
    return [(trace.head(n), 4, capacity) for n in range(start, len(trace.count) + 1)]


def _same(a: Forecast, b: Forecast) -> bool:
    return (
        a.method == b.method
        and np.array_equal(a.point, b.point)
        and np.array_equal(a.pmf, b.pmf)
        and np.array_equal(a.expected_preempted, b.expected_preempted)
        and np.array_equal(a.expected_allocated, b.expected_allocated)
    )


def _check_against_unshared(name: str, questions: list[Question]) -> None:
    alone, together = make_predictor(name), SharedPredictor(name)
    for index, question in enumerate(questions):
        assert _same(together.forecast(*question), alone.forecast(*question)), (name, index)


@pytest.mark.parametrize("name", ["auto", "markov", "persistence"])
def test_shared_answers_are_an_unshared_predictors_whatever_was_asked_before(name: str) -> None:
    trace = generate_trace(16, 1.5, seed=3).resample(60)
    other = generate_trace(16, 1.5, seed=4).resample(60)
    common = _questions(trace)
    _check_against_unshared(name, common)  # the first: computes every forecast
    _check_against_unshared(name, common)  # the same questions: every answer kept
    # The same questions up to interval 50, then another trace's, then another capacity: each
    # departure replays what was skipped before it answers.
    _check_against_unshared(name, common[:50] + _questions(other, start=51))
    _check_against_unshared(name, common[:30] + _questions(trace, capacity=48, start=31))


def test_a_predictor_asked_answered_questions_computes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = []
    forecast = PersistencePredictor.forecast

    def counted(self: PersistencePredictor, *question: object) -> Forecast:
        calls.append(question)
        return forecast(self, *question)

    monkeypatch.setattr(PersistencePredictor, "forecast", counted)
    trace = generate_trace(12, 1, seed=5).resample(60)
    questions = _questions(trace)
    one = SharedPredictor("persistence")
    first = [one.forecast(*q) for q in questions]
    assert len(calls) == len(questions)
    second = SharedPredictor("persistence")
    assert all(_same(second.forecast(*q), f) for q, f in zip(questions, first, strict=True))
    assert len(calls) == len(questions)  # nothing computed again
    # An answer changed by its caller leaves the kept one as it was.
    again = SharedPredictor("persistence").forecast(*questions[0])
    again.pmf[:] = 0.0
    assert _same(SharedPredictor("persistence").forecast(*questions[0]), first[0])


def test_forecasts_dropped_past_the_limit_are_made_again_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trace = generate_trace(16, 1, seed=6).resample(60)
    questions = _questions(trace)
    one = shared._size(make_predictor("auto").forecast(*questions[0]))
    monkeypatch.setattr(shared, "KEPT_BYTES", 7 * one)
    _check_against_unshared("auto", questions)
    assert len(shared._kept) == 7 and shared._kept_bytes == 7 * one
    _check_against_unshared("auto", _questions(trace))  # the last 7 kept, the rest made again
