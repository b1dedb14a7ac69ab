"""A real AWS API endpoint on this machine: moto's server (EC2, S3, SSM over HTTP).

The AWS provider's tests launch instances through it, and ``bench peers``' pipeline regime keeps
every system's checkpoints in an S3 bucket on it. It runs as a subprocess (``python -m
moto.server``, from the test dependencies) on a free port of the address given, and is answering
when :func:`aws_endpoint` yields its URL.
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from liveput.testbed.errors import TestbedError
from liveput.testbed.etcd import free_port


@contextmanager
def aws_endpoint(log_path: Path, host: str = "127.0.0.1", timeout_s: float = 30.0) -> Iterator[str]:
    """moto's server on a free port of ``host``, its output appended to ``log_path``; its URL,
    once it answers. Stopped (SIGTERM, then SIGKILL) at the end."""
    port = free_port(host)
    url = f"http://{host}:{port}"
    with open(log_path, "ab") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", host, "-p", str(port)],
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
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
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)
