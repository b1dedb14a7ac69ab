"""Preemption-notice watchers: AWS and GCP instance metadata, SIGTERM, and the emulator's signal.

Each watcher answers :meth:`NoticeWatcher.poll` with a :class:`Notice` once the instance has been
told it will go (and keeps answering it: a notice is never withdrawn), or ``None``.
:class:`NoticeMonitor` polls several watchers on a thread and calls back once, at the first notice.

Sources (lead times as the clouds document them: AWS's spot interruption notice comes 2 minutes
ahead, GCP's preemption notice 30 s):

- AWS: ``GET /latest/meta-data/spot/instance-action`` with an IMDSv2 session token (``PUT
  /latest/api/token``); 404 means no notice; 200 carries ``{"action": ..., "time": ...}``.
- GCP: ``GET /computeMetadata/v1/instance/preempted`` with ``Metadata-Flavor: Google``; ``TRUE``.
- Signals: SIGTERM (what most schedulers and ``ACPI`` shutdowns send) or any signal given.
- The emulator (:mod:`liveput.cloud.emulated`) writes a JSON notice file (and optionally a store
  key), then sends SIGUSR1.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import signal
import threading
import time
import urllib.error
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Any

from liveput.errors import LiveputError
from liveput.files import write_text_atomic
from liveput.runtime.clock import Clock, MonotonicClock
from liveput.runtime.store import Store

log = logging.getLogger(__name__)

__all__ = [
    "AWS_NOTICE_LEAD_S",
    "GCP_NOTICE_LEAD_S",
    "Notice",
    "NoticeWatcher",
    "AwsNoticeWatcher",
    "GcpNoticeWatcher",
    "SignalNoticeWatcher",
    "EmulatorNoticeWatcher",
    "NoticeMonitor",
    "write_notice_file",
    "read_notice_file",
]

AWS_NOTICE_LEAD_S = 120.0
"""AWS spot interruption notice: two minutes before the instance is stopped or terminated."""
GCP_NOTICE_LEAD_S = 30.0
"""GCP preemption notice: 30 seconds before a preemptible/spot VM is stopped."""

AWS_METADATA_ENDPOINT = "http://169.254.169.254"
GCP_METADATA_ENDPOINT = "http://metadata.google.internal"


@dataclass(frozen=True)
class Notice:
    """This instance has been told it will be taken away."""

    source: str
    """Who said so: ``aws``, ``gcp``, ``signal`` or ``emulator``."""
    action: str
    """What will happen, in the source's words (``terminate``, ``stop``, ``preempted``,
    ``SIGTERM``)."""
    lead_s: float | None
    """Seconds from the notice to the instance's end, when the source says (None if unknown)."""
    detail: str = ""
    """The raw notice (a JSON body, a signal name, an instance id) for logs."""

    def to_json(self) -> str:
        """The notice as one JSON object."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str, where: str) -> Notice:
        """Parse :meth:`to_json` output; LiveputError naming ``where`` if malformed."""
        try:
            data = json.loads(text)
            lead = data.get("lead_s")
            return cls(
                source=str(data["source"]),
                action=str(data["action"]),
                lead_s=None if lead is None else float(lead),
                detail=str(data.get("detail", "")),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise LiveputError(f"malformed preemption notice in {where}: {exc}") from None


class NoticeWatcher(ABC):
    """Watches one source of preemption notices."""

    wake: threading.Event | None = None
    """Set by a watcher that learns of a notice asynchronously (a signal), to wake a monitor."""

    @abstractmethod
    def poll(self) -> Notice | None:
        """The standing notice, or None. LiveputError if the source cannot be asked."""

    def close(self) -> None:
        """Undo what the watcher installed (signal handlers). Idempotent."""


def _http(request: urllib.request.Request, timeout_s: float) -> tuple[int, str]:
    """(status, body) of one request; HTTP errors are statuses, network failures LiveputError."""
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            return int(resp.status), resp.read(64_000).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read(64_000).decode("utf-8", "replace") if exc.fp else ""
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise LiveputError(f"metadata service {request.full_url} unreachable: {reason}") from None


class AwsNoticeWatcher(NoticeWatcher):
    """AWS EC2 spot interruption notice, through instance metadata (IMDSv2, falling back to v1)."""

    def __init__(
        self,
        endpoint: str = AWS_METADATA_ENDPOINT,
        *,
        timeout_s: float = 1.0,
        token_ttl_s: int = 21600,
        clock: Clock | None = None,
        now_unix_s: Callable[[], float] | None = None,
    ) -> None:
        self.endpoint = endpoint.rstrip("/")
        self._timeout_s = timeout_s
        self._token_ttl_s = int(token_ttl_s)
        self._clock = clock or MonotonicClock()
        # The notice gives an absolute UTC time; the lead is that minus wall-clock now.
        self._now_unix_s = now_unix_s or (lambda: datetime.now().timestamp())
        self._token: str | None = None
        self._token_expires_s = 0.0
        self._imds_v1 = False
        self._notice: Notice | None = None

    def _session_token(self, refresh: bool = False) -> str | None:
        if self._imds_v1:
            return None
        if self._token and not refresh and self._clock.now_s() < self._token_expires_s:
            return self._token
        request = urllib.request.Request(
            self.endpoint + "/latest/api/token",
            method="PUT",
            headers={"X-aws-ec2-metadata-token-ttl-seconds": str(self._token_ttl_s)},
        )
        status, body = _http(request, self._timeout_s)
        if status in (403, 404, 405):  # IMDSv2 disabled or absent: v1 answers without a token
            self._imds_v1 = True
            return None
        if status != 200 or not body:
            raise LiveputError(
                f"metadata service {request.full_url} refused a session token (HTTP {status})"
            )
        self._token = body.strip()
        self._token_expires_s = self._clock.now_s() + self._token_ttl_s / 2
        return self._token

    def _instance_action(self, token: str | None) -> tuple[int, str]:
        headers = {} if token is None else {"X-aws-ec2-metadata-token": token}
        url = self.endpoint + "/latest/meta-data/spot/instance-action"
        return _http(urllib.request.Request(url, headers=headers), self._timeout_s)

    def poll(self) -> Notice | None:
        if self._notice is not None:
            return self._notice
        status, body = self._instance_action(self._session_token())
        if status == 401:  # token expired or revoked
            status, body = self._instance_action(self._session_token(refresh=True))
        if status == 404:
            return None
        if status != 200:
            raise LiveputError(
                f"metadata service {self.endpoint}: spot/instance-action answered HTTP {status}"
            )
        try:
            data = json.loads(body)
            action = str(data["action"])
            end = datetime.fromisoformat(str(data["time"]).replace("Z", "+00:00")).timestamp()
        except (ValueError, KeyError, TypeError) as exc:
            raise LiveputError(
                f"metadata service {self.endpoint}: malformed instance-action {body[:80]!r}: {exc}"
            ) from None
        self._notice = Notice("aws", action, max(0.0, end - self._now_unix_s()), body.strip())
        return self._notice


class GcpNoticeWatcher(NoticeWatcher):
    """GCP preemption notice: the metadata server's ``instance/preempted`` turns ``TRUE``."""

    def __init__(self, endpoint: str = GCP_METADATA_ENDPOINT, *, timeout_s: float = 1.0) -> None:
        self.endpoint = endpoint.rstrip("/")
        self._timeout_s = timeout_s
        self._notice: Notice | None = None

    def poll(self) -> Notice | None:
        if self._notice is not None:
            return self._notice
        url = self.endpoint + "/computeMetadata/v1/instance/preempted"
        status, body = _http(
            urllib.request.Request(url, headers={"Metadata-Flavor": "Google"}), self._timeout_s
        )
        if status != 200:
            raise LiveputError(f"metadata service {url} answered HTTP {status}")
        if body.strip().upper() != "TRUE":
            return None
        self._notice = Notice("gcp", "preempted", GCP_NOTICE_LEAD_S, body.strip())
        return self._notice


class SignalNoticeWatcher(NoticeWatcher):
    """A notice is a signal (SIGTERM by default). Installs handlers: construct it in the main
    thread."""

    def __init__(
        self, signals: Sequence[int] = (signal.SIGTERM,), *, lead_s: float | None = None
    ) -> None:
        self._lead_s = lead_s
        self._received: int | None = None
        self._previous: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            raise LiveputError("signal notice watchers must be created in the main thread")
        for signum in signals:
            self._previous[signum] = signal.signal(signum, self._on_signal)
        # An emulated cloud launches agents with its notice signal blocked (a notice due at
        # launch must not end the process before this handler exists): a pending one is
        # delivered now.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, set(signals))

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._received is None:
            self._received = signum
        if self.wake is not None:
            self.wake.set()

    def poll(self) -> Notice | None:
        if self._received is None:
            return None
        name = signal.Signals(self._received).name
        return Notice("signal", name, self._lead_s, name)

    def close(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}


def write_notice_file(path: Path, notice: Notice) -> None:
    """Write ``notice`` to ``path`` atomically (a reader never sees half a notice)."""
    write_text_atomic(path, notice.to_json())


def read_notice_file(path: Path) -> Notice | None:
    """The notice in ``path``, or None if there is no file."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None
    return Notice.from_json(text, str(path))


class EmulatorNoticeWatcher(NoticeWatcher):
    """The emulated cloud's notice: a JSON file and/or a store key, announced by a signal.

    The signal (SIGUSR1 by default; None for none) only wakes the agent early; the file or key is
    the notice, so a missed signal costs at most one poll interval. Installing the handler also
    stops SIGUSR1 from killing the process (its default action). Construct in the main thread when
    a signal is given.

    A file's lead counts from when the file was written (its mtime, against ``now_unix_s``), as
    an AWS notice's counts to the time it names: an agent still starting reads it seconds late,
    and reported as written its end came seconds after the cloud's.
    """

    def __init__(
        self,
        notice_file: Path | None = None,
        *,
        signum: int | None = signal.SIGUSR1,
        store: Store | None = None,
        store_key: str | None = None,
        now_unix_s: Callable[[], float] = time.time,
    ) -> None:
        if notice_file is None and (store is None or not store_key):
            raise LiveputError("emulator notice watcher needs a notice file or a store and key")
        self._file = None if notice_file is None else Path(notice_file)
        self._store = store
        self._store_key = store_key
        self._now_unix_s = now_unix_s
        self._signals: SignalNoticeWatcher | None = None
        self._notice: Notice | None = None
        if signum is not None:
            self._signals = SignalNoticeWatcher((signum,))

    @property
    def wake(self) -> threading.Event | None:
        return None if self._signals is None else self._signals.wake

    @wake.setter
    def wake(self, event: threading.Event | None) -> None:
        if self._signals is not None:
            self._signals.wake = event

    def poll(self) -> Notice | None:
        if self._notice is not None:
            return self._notice
        notice = None if self._file is None else self._read_file(self._file)
        if notice is None and self._store is not None and self._store_key:
            raw = self._store.get(self._store_key)
            if raw is not None:
                notice = Notice.from_json(
                    raw.decode("utf-8", "replace"), f"store key {self._store_key!r}"
                )
        self._notice = notice
        return notice

    def _read_file(self, path: Path) -> Notice | None:
        """The file's notice, with the lead left now (class docstring)."""
        notice = read_notice_file(path)
        if notice is None or notice.lead_s is None:
            return notice
        try:
            age_s = max(0.0, self._now_unix_s() - path.stat().st_mtime)
        except FileNotFoundError:
            return notice
        return dataclasses.replace(notice, lead_s=max(0.0, notice.lead_s - age_s))

    def close(self) -> None:
        if self._signals is not None:
            self._signals.close()


@dataclass
class NoticeMonitor:
    """Polls watchers on a daemon thread; calls ``on_notice`` once, with the first notice seen."""

    watchers: Sequence[NoticeWatcher]
    """The sources to watch."""
    on_notice: Callable[[Notice], None]
    """Called (on the monitor thread) with the first notice."""
    interval_s: float = 0.5
    """Pause between polls; a signal-based watcher wakes the monitor at once."""

    def __post_init__(self) -> None:
        if not self.watchers:
            raise LiveputError("notice monitor needs at least one watcher")
        if not self.interval_s > 0:
            raise LiveputError(f"notice poll interval must be positive, got {self.interval_s}")
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._failing: set[int] = set()
        for watcher in self.watchers:
            watcher.wake = self._wake
        self.notice: Notice | None = None
        self._thread = threading.Thread(target=self._run, name="liveput-notices", daemon=True)

    def start(self) -> NoticeMonitor:
        """Start polling."""
        self._thread.start()
        return self

    def poll_once(self) -> Notice | None:
        """Poll every watcher once; the first standing notice. A failing source is logged once."""
        for index, watcher in enumerate(self.watchers):
            try:
                notice = watcher.poll()
            except LiveputError as exc:
                if index not in self._failing:
                    self._failing.add(index)
                    log.warning("preemption notices: %s", exc)
                continue
            if notice is not None:
                return notice
        return None

    def _run(self) -> None:
        while not self._stop.is_set():
            notice = self.poll_once()
            if notice is not None:
                self.notice = notice
                log.info(
                    "preemption notice from %s: %s (lead %s s)",
                    notice.source,
                    notice.action,
                    notice.lead_s,
                )
                self.on_notice(notice)
                return
            self._wake.wait(self.interval_s)
            self._wake.clear()

    def close(self) -> None:
        """Stop the thread and restore what watchers installed."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        for watcher in self.watchers:
            watcher.close()
