"""A real AWS API endpoint on this machine: moto's server (EC2, S3, SSM over HTTP).

The AWS provider's tests launch instances through it, and ``bench peers``' pipeline regime keeps
every system's checkpoints in an S3 bucket on it. It runs as a subprocess (moto.server's
``main``, from the test dependencies) on a free port of the address given, and is answering
when :func:`aws_endpoint` yields its URL. While it runs, :func:`server_stacks` has it write where
each of its threads is (on ``SIGUSR1``), for an error that says why a request
went unanswered.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from liveput.testbed.errors import TestbedError
from liveput.testbed.etcd import free_port

_SERVER_CODE = """
import signal, sys, threading, traceback

def dump(signum, frame):
    main = threading.main_thread().ident
    stacks = sorted(sys._current_frames().items(), key=lambda item: item[0] == main)
    for ident, top in stacks:
        lines = "".join(reversed(traceback.format_stack(top)))
        sys.stderr.write(f"Thread {ident:#x} (most recent call first):\\n{lines}")
    sys.stderr.flush()

signal.signal(signal.SIGUSR1, dump)
from moto.server import main
main(sys.argv[1:])
"""
"""``python -m moto.server``, with every thread's stack written to its log on ``SIGUSR1``, the
main thread's last. Written by a Python handler, which holds the interpreter while it reads the
other threads' frames: ``faulthandler``'s dump reads them from the signal as they run, and once
killed the server mid-dump (every later test of the module found nothing on its port)."""
_RUNNING: dict[str, tuple[subprocess.Popen, Path]] = {}
"""URL -> the server answering there and its log, while :func:`aws_endpoint` runs it."""


@contextmanager
def aws_endpoint(log_path: Path, host: str = "127.0.0.1", timeout_s: float = 30.0) -> Iterator[str]:
    """moto's server on a free port of ``host``, its output appended to ``log_path``; its URL,
    once it answers. Stopped (SIGTERM, then SIGKILL) at the end.

    Its EC2 regions start without moto's catalogue of public images (``MOTO_EC2_LOAD_DEFAULT_
    AMIS``; the default image is read from SSM, whose public parameters moto keeps apart): each
    region's EC2 made an image and a volume for each of them at its first use and again at every
    reset (``/moto-api/reset``), which took 0.16 s on an idle machine and once more than 5 s in a
    loaded suite (the reset's stack: in those images' volumes); without them 0.01 s."""
    port = free_port(host)
    url = f"http://{host}:{port}"
    with open(log_path, "ab") as log:
        server = subprocess.Popen(
            [sys.executable, "-c", _SERVER_CODE, "-H", host, "-p", str(port)],
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "MOTO_EC2_LOAD_DEFAULT_AMIS": "false"},
        )
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(f"{url}/moto-api/", timeout=1.0):
                    break
            except OSError:
                if server.poll() is not None:
                    tail = log_path.read_text(errors="replace").strip().splitlines()[-1:]
                    raise TestbedError(
                        f"moto's server at {url} exited: {tail[0] if tail else 'no output'}"
                    ) from None
                if time.monotonic() > deadline:
                    raise TestbedError(
                        f"moto's server at {url} did not answer in {timeout_s:g} s"
                    ) from None
                time.sleep(0.1)
        _RUNNING[url] = (server, log_path)
        yield url
    finally:
        _RUNNING.pop(url, None)
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)


def server_stacks(url: str, wait_s: float = 5.0) -> str:
    """Where each thread of the server at ``url`` (started by :func:`aws_endpoint`) is now, as
    it writes them to its log (waited for up to ``wait_s``); a sentence where it cannot say."""
    running = _RUNNING.get(url)
    if running is None:
        return f"no server of this process answers at {url}"
    server, log_path = running
    if server.poll() is not None:
        return f"the server at {url} has exited ({server.returncode})"
    already = log_path.stat().st_size
    server.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + wait_s
    text = ""
    # The main thread's stack is written last, and ends in the ``-c`` program's module.
    while "in <module>" not in text and time.monotonic() < deadline:
        time.sleep(0.05)
        with open(log_path, "rb") as log:
            log.seek(already)
            text = log.read().decode(errors="replace").strip()
    return text or f"nothing in {wait_s:g} s"
