"""Running the `liveput` command line as a user does, for the tests that launch jobs: the CLI
in a subprocess (with this checkout's sources), a job's status, waiting, a process group."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

LIVEPUT = [sys.executable, "-m", "liveput.cli.main"]
SRC = str(Path(__file__).resolve().parents[1] / "src")


def cli_env() -> dict[str, str]:
    """This environment, with this checkout's sources first on the path."""
    return {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}


def cli(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``liveput ARGV`` run to its end, its output captured."""
    return subprocess.run(
        [*LIVEPUT, *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cli_env(),
        stdin=subprocess.DEVNULL,
    )


def job_status(job_file: Path) -> dict:
    """``liveput status JOB_FILE --json``, which must succeed."""
    done = cli("status", str(job_file), "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def wait_for(condition, timeout_s: float, what: str, interval_s: float = 0.2):  # noqa: ANN001, ANN201
    """``condition()``'s first true value within ``timeout_s``, else an AssertionError;
    ``interval_s`` between tries (a condition that starts a process asks for a longer one)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"not within {timeout_s} s: {what}")


def group_members(group: int) -> list[int]:
    """Processes of process group ``group`` that are not zombies."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(fields[2]) == group and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members
