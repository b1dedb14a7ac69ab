"""When a provider's API says that an instance the cloud ended is gone: the loss signal delay.

A spot instance's processes die at its kill time, but no provider's API says so at that moment:
EC2's ``DescribeInstances`` is eventually consistent and its state-change events are delivered
on a best-effort basis; a Compute Engine Spot VM lists as ``STOPPING`` until it is powered off
(``docs/peers.md``, "Signals"). The emulated provider keeps the true end of every instance (what
billing charges) and shows its API's callers, until the report is due, the instance as it was
before it ended: running, not preempted. Every time here is in cloud (trace) seconds.
"""

from __future__ import annotations

import dataclasses

from liveput.cloud.types import InstanceRecord, InstanceState
from liveput.errors import LiveputError

__all__ = ["check_loss_signal_delay", "report_s", "as_reported"]


def check_loss_signal_delay(delay_s: float | None, what: str) -> None:
    """A ``ValueError`` (one line, naming ``what``) unless ``delay_s`` is None or >= 0."""
    if delay_s is not None and not delay_s >= 0:
        raise LiveputError(f"{what}: the loss signal delay must be >= 0 s or none, got {delay_s}")


def report_s(end_s: float, delay_s: float | None) -> float | None:
    """When the API reports an end at ``end_s`` (None: never, ``delay_s`` None)."""
    return None if delay_s is None else end_s + delay_s


def as_reported(record: InstanceRecord, due_s: float | None, now_s: float) -> InstanceRecord:
    """``record`` as the API shows it at ``now_s`` when its end is reported at ``due_s`` (None:
    never): before that, still running (an instance only ends by the cloud's hand once it ran)."""
    if record.end_s is None or (due_s is not None and now_s >= due_s):
        return record
    return dataclasses.replace(record, state=InstanceState.RUNNING, end_s=None, preempted=False)
