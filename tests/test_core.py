"""The core contracts: the trace type, registries, errors and the CLI's error handling."""

from __future__ import annotations

import numpy as np
import pytest

from liveput.cli.main import main
from liveput.errors import LiveputError
from liveput.forecast.base import Forecast
from liveput.perf.configuration import Configuration
from liveput.registry import Registry
from liveput.traces.trace import IntervalTrace, Trace


def make_trace() -> Trace:
    # 4 at 0; +2 at 30 s; -3 at 60 s; -1 and +1 at 150 s; ends at 200 s.
    return Trace("t", 4, [30, 60, 150], [2, 0, 1], [0, 3, 1], end_s=200)


def test_counts_and_time_weighted_mean() -> None:
    trace = make_trace()
    assert trace.counts.tolist() == [6, 3, 3]
    assert trace.count_at([0, 29.9, 30, 60, 199]).tolist() == [4, 4, 6, 3, 3]
    assert trace.mean_count() == pytest.approx((4 * 30 + 6 * 30 + 3 * 140) / 200)
    assert (trace.min_count(), trace.max_count()) == (3, 6)


def test_resample_balances_and_puts_boundary_events_in_the_earlier_interval() -> None:
    resampled = make_trace().resample(60)
    assert resampled.count.tolist() == [4, 3, 3, 3]
    assert resampled.allocated.tolist() == [2, 0, 1, 0]
    assert resampled.preempted.tolist() == [3, 0, 1, 0]
    assert resampled.end_count == 3


def test_slice_rebases_and_keeps_the_count_at_the_cut() -> None:
    part = make_trace().slice(45, 160)
    assert part.initial_count == 6
    assert part.times_s.tolist() == [15, 105]
    assert part.end_s == pytest.approx(115)


def test_trace_is_immutable() -> None:
    with pytest.raises(ValueError):
        make_trace().times_s[0] = 5


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(initial_count=1, times_s=[10], added=[0], removed=[2], end_s=20), "negative"),
        (
            dict(initial_count=1, times_s=[10, 5], added=[1, 1], removed=[0, 0], end_s=20),
            "increasing",
        ),
        (dict(initial_count=1, times_s=[10], added=[1], removed=[0], end_s=5), "before its last"),
    ],
)
def test_invalid_traces_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(LiveputError, match=message):
        Trace("bad", **kwargs)


def test_interval_trace_must_balance() -> None:
    with pytest.raises(LiveputError, match="does not balance"):
        IntervalTrace("x", 60, count=[3, 5], preempted=[0, 0], allocated=[1, 0])


def test_registry_reports_unknown_names_with_the_known_ones() -> None:
    registry: Registry[int] = Registry("widget")
    registry.register("a")(1)
    assert registry.get("a") == 1
    with pytest.raises(LiveputError, match="unknown widget 'b'; known: a"):
        registry.get("b")


def test_error_messages_are_one_line() -> None:
    assert "\n" not in str(LiveputError("line one\nline two"))


def test_configuration_parse() -> None:
    assert Configuration.parse("4x8") == Configuration(4, 8)
    with pytest.raises(LiveputError, match="DxP"):
        Configuration.parse("four")


def test_certain_forecast_quantiles_are_the_counts() -> None:
    forecast = Forecast.certain(np.array([3, 5, 2]), capacity=6)
    assert forecast.quantile(0.5).tolist() == [3, 5, 2]
    assert forecast.capacity == 6


def test_cli_usage_error_exits_non_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["no-such-command"]) == 2
    assert "Traceback" not in capsys.readouterr().err
