"""The provider contract's shared machinery: retries with backoff, exact partial accounting."""

from __future__ import annotations

import pytest
from cloud_fakes import FakeProvider, throttled

from liveput.cloud import Market, ProviderError, ProviderEventKind, RequestResult, RetryPolicy
from liveput.errors import LiveputError
from liveput.runtime.clock import ManualClock


def test_throttling_and_capacity_errors_are_retried_with_exponential_backoff() -> None:
    clock = ManualClock(0.0)
    provider = FakeProvider(
        clock,
        RetryPolicy(max_attempts=5, base_delay_s=1.0, multiplier=2.0, max_delay_s=30.0),
        grants=[throttled(), 2, throttled(), 3],
    )
    result = provider.request(5, "small", "spot")
    assert (len(result.granted), result.failed, provider.tries) == (5, 0, 4)
    assert clock.now_s() == 1.0 + 2.0 + 4.0  # waits after tries 1, 2, 3
    retries = [e for e in provider.events if e.kind is ProviderEventKind.RETRY]
    assert [e.time_s for e in retries] == [0.0, 1.0, 3.0]
    assert "RequestLimitExceeded" in retries[0].detail and "try 2 of 5 in 1 s" in retries[0].detail
    assert "InsufficientInstanceCapacity" in retries[1].detail


def test_what_is_still_missing_after_the_last_try_is_one_failure_counted_exactly() -> None:
    clock = ManualClock(0.0)
    provider = FakeProvider(
        clock,
        RetryPolicy(max_attempts=3, base_delay_s=2.0, max_delay_s=3.0),
        grants=[1, throttled(), 2],
    )
    result = provider.request(7, ["large", "small"], Market.ON_DEMAND)
    assert [r.instance_type for r in result.granted] == ["large"] * 3
    (failure,) = result.failures
    assert (failure.count, failure.code, failure.attempts) == (4, "InsufficientInstanceCapacity", 3)
    assert len(result.granted) + result.failed == 7
    assert clock.now_s() == 2.0 + 3.0  # the second wait is capped at max_delay_s
    assert provider.events[-1].kind is ProviderEventKind.FAIL
    with pytest.raises(
        LiveputError,
        match=r"^3 of 7 on-demand instance\(s\) granted; 4 failed: "
        r"InsufficientInstanceCapacity: .* \(after 3 attempt",
    ):
        result.check()


def test_an_error_not_worth_retrying_fails_at_once() -> None:
    clock = ManualClock(0.0)
    quota = ProviderError(
        "VcpuLimitExceeded",
        "You have requested more vCPU capacity than your current vCPU limit of 32 allows.",
        retryable=False,
    )
    provider = FakeProvider(clock, grants=[quota])
    result = provider.request(2, "small", "spot")
    assert (result.granted, result.failed, provider.tries, clock.now_s()) == ((), 2, 1, 0.0)


def test_other_calls_retry_then_fail_in_one_line() -> None:
    clock = ManualClock(0.0)
    provider = FakeProvider(
        clock,
        RetryPolicy(max_attempts=2, base_delay_s=0.5),
        calls=[throttled(), throttled(), throttled()],
    )
    with pytest.raises(
        LiveputError,
        match=r"^fake: list instances failed after 2 attempt\(s\): "
        r"RequestLimitExceeded: Request limit exceeded\.$",
    ):
        provider.instances()
    assert clock.now_s() == 0.5
    quotes = provider.prices("small", ["fake-1b"])  # the third throttle, then an answer
    assert [(q.zone, q.spot_usd_per_hour) for q in quotes] == [("fake-1b", 1.0)]


def test_release_and_bill_through_the_contract() -> None:
    clock = ManualClock(0.0)
    provider = FakeProvider(clock)
    spot = provider.request(2, "small", "spot")
    od = provider.request(1, "small", "on-demand")
    clock.advance(1800.0)
    assert provider.release([spot.instance_ids[0], od.instance_ids[0]]) == [
        spot.instance_ids[0],
        od.instance_ids[0],
    ]
    clock.advance(1800.0)
    bill = provider.bill()
    assert bill.usd_spot == pytest.approx(1.0 * 0.5 + 1.0 * 1.0)
    assert bill.usd_on_demand == pytest.approx(3.0 * 0.5)
    assert bill.on_demand_hours == pytest.approx(0.5)


def test_a_result_that_does_not_add_up_is_refused() -> None:
    with pytest.raises(LiveputError, match="0 granted \\+ 0 failed != 2 requested"):
        RequestResult(2, Market.SPOT, ())


@pytest.mark.parametrize(
    "kwargs", [{"max_attempts": 0}, {"multiplier": 0.5}, {"base_delay_s": -1.0}, {"jitter": 1.0}]
)
def test_bad_retry_policies_are_one_line_errors(kwargs: dict) -> None:
    with pytest.raises(LiveputError, match="^retry: "):
        RetryPolicy(**kwargs)


def test_jitter_is_seeded_and_only_shortens() -> None:
    waits = [RetryPolicy(jitter=0.5, seed=7).delay_s(k) for k in (1, 2, 3)]
    assert waits == [RetryPolicy(jitter=0.5, seed=7).delay_s(k) for k in (1, 2, 3)]
    assert all(0.5 * full <= w <= full for w, full in zip(waits, (1.0, 2.0, 4.0), strict=True))


def test_the_holder_asks_again_for_what_a_request_could_not_get() -> None:
    from liveput.cloud.holding import InstanceHolder
    from liveput.policies.base import Provisioning

    provider = FakeProvider(ManualClock(0.0), RetryPolicy(max_attempts=1), grants=[1, 0])
    holder = InstanceHolder(provider, Provisioning(spot=3, on_demand=1), ["small"])
    first = holder.reconcile()
    assert [(len(r.granted), r.failed) for r in first.requests] == [(1, 2), (0, 1)]
    assert first.alive == Provisioning(1, 0)
    second = holder.reconcile()
    assert [(r.requested, len(r.granted)) for r in second.requests] == [(2, 2), (1, 1)]
    assert second.alive == Provisioning(3, 1)
    assert holder.reconcile().requests == ()  # held: nothing to do


def test_user_data_round_trip_and_bad_tokens() -> None:
    from liveput.cloud.userdata import AgentBoot, agent_user_data, parse_agent_command

    boot = AgentBoot("etcd://10.0.0.1:2379", "abc123", package="liveput==9.9", notices="aws")
    script = agent_user_data(boot)
    assert script.startswith("#!/bin/bash\n") and "pip install --quiet liveput==9.9" in script
    command = parse_agent_command(script)
    assert command.resolved(["liveput"], "10.0.0.7") == [
        "liveput",
        "agent",
        "--store",
        "etcd://10.0.0.1:2379",
        "--host",
        "10.0.0.7",
        "--notices",
        "aws",
    ]
    assert command.env == {"LIVEPUT_TOKEN": "abc123"}
    with pytest.raises(LiveputError, match="the job token must be non-empty, without spaces"):
        AgentBoot("h:1", "a'b")
    with pytest.raises(LiveputError, match="starts no `liveput agent`"):
        parse_agent_command("#!/bin/bash\necho hello\n")
