"""Store errors that cannot heal are not retried: a malformed store URL is one line at once; an
unreachable store is waited for (said once, with how long) and given up on at the limit."""

from __future__ import annotations

import logging
import time

import pytest

from liveput.cli.main import main
from liveput.errors import LiveputError
from liveput.runtime.launch import through_outage
from liveput.runtime.store import open_store
from liveput.runtime.store.base import StoreAddressError


@pytest.mark.parametrize("url", ["bogus://x", "etcd://no-port", "tcp://h:99999", "plain"])
def test_a_malformed_store_url_is_not_retried(url: str) -> None:
    calls = []

    def attempt() -> None:
        calls.append(1)
        open_store(url)

    started = time.monotonic()
    with pytest.raises(StoreAddressError, match="store URL"):
        through_outage(attempt, outage_s=30.0, retry_s=0.01)
    assert calls == [1] and time.monotonic() - started < 1.0


def test_an_unreachable_store_is_waited_for_once_said_then_given_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls = []

    def attempt() -> None:
        calls.append(1)
        raise LiveputError("store etcd://127.0.0.1:1 unreachable: ConnectionFailedError")

    with caplog.at_level(logging.DEBUG, logger="liveput.runtime.launch"):
        with pytest.raises(LiveputError, match="unreachable"):
            through_outage(attempt, outage_s=0.3, retry_s=0.02)
    waits = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(calls) > 3 and len(waits) == 1
    assert "waiting up to" in waits[0].getMessage() and "unreachable" in waits[0].getMessage()


def test_the_coordinator_refuses_a_malformed_store_url_in_one_line(
    tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    started = time.monotonic()
    argv = ["coordinator", "--store", "bogus://x", "--token", "t", "--steps", "2"]
    assert main([*argv, "--checkpoint-dir", str(tmp_path / "ckpt")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [lines[-1]] and "unknown scheme" in lines[-1]
    assert time.monotonic() - started < 60.0  # not the 120 s of --connect-timeout
    assert not (tmp_path / "ckpt").exists()  # refused: no folder left behind


def test_train_refuses_a_malformed_store_url_before_it_makes_any_folder(
    tmp_path, monkeypatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    argv = ["train", "--store", "bogus://x", "--steps", "2", "--checkpoint-dir", "ck"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--store" in err[0] and "unknown scheme" in err[0]
    assert list(tmp_path.iterdir()) == []  # no checkpoint, log or model folder
