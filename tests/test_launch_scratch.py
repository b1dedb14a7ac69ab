"""``liveput train``'s scratch folder: its name carries its creator's pid, and a run starting
removes the folders of runs that no longer run (a SIGKILLed run left its own behind)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from liveput.launch.scratch import remove_stale_scratch, scratch_folder

NO_SUCH_PID = 4_194_305
"""Above Linux's largest pid_max (2**22): no process has it."""


def _folder(parent: Path, name: str) -> Path:
    path = parent / name
    (path / "checkpoints" / "step-9").mkdir(parents=True)
    (path / "checkpoints" / "step-9" / "layer-0.pt").write_bytes(b"\0" * 64)
    return path


def test_a_killed_runs_folder_goes_and_live_or_unknown_ones_stay(tmp_path: Path) -> None:
    killed = _folder(tmp_path, f"liveput-train-{NO_SUCH_PID}-abc123")
    running = _folder(tmp_path, f"liveput-train-{os.getpid()}-def456")
    older = _folder(tmp_path, "liveput-train-k3j2h1g0")  # the name before the pid: whose?
    other = _folder(tmp_path, f"liveput-other-{NO_SUCH_PID}-x")
    assert remove_stale_scratch(tmp_path) == [killed]
    assert not killed.exists()
    assert running.is_dir() and older.is_dir() and other.is_dir()
    assert remove_stale_scratch(tmp_path) == []


def test_a_run_names_its_folder_by_its_pid_and_clears_killed_ones_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    killed = _folder(tmp_path, f"liveput-train-{NO_SUCH_PID}-abc123")
    with scratch_folder() as scratch:
        assert Path(scratch).parent == tmp_path
        assert Path(scratch).name.startswith(f"liveput-train-{os.getpid()}-")
        assert not killed.exists()
        assert remove_stale_scratch(tmp_path) == []  # its own stays while it runs
    assert not Path(scratch).exists()
