"""What the README promises a newcomer: its commands run as written and help reads right (its
own-model example: tests/test_readme_own_model.py).

The quick start's ``make run`` recipe (from the Makefile) runs first, in a fresh folder, then every
``liveput`` line of the README's fenced ``bash`` blocks, exactly as written, as a user would type
it: each must exit 0 without a traceback, and a ``--json`` line must print one JSON object.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from liveput.cli.main import _command

ROOT = Path(__file__).resolve().parents[1]
LIVEPUT = Path(sys.executable).with_name("liveput")


def _make_run_commands() -> list[str]:
    """The ``liveput`` lines of the Makefile's ``run`` recipe (continuations joined), up to the
    example job it launches."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    recipe = text.split("\nrun:", 1)[1].split("\n\n", 1)[0]
    # The launched example job at its end is tested by tests/test_operate_job.py.
    return [
        " ".join(line.split()).replace("$(BIN)/liveput", "liveput")
        for line in recipe.splitlines()
        if "$(BIN)/liveput" in line and "docs/examples/" not in line
    ]


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    return [
        line.split("#", 1)[0].strip()
        for block in blocks
        for line in block.splitlines()
        if line.startswith("liveput ")
    ]


def test_the_readme_lists_commands_of_every_group() -> None:
    commands = _readme_commands()
    groups = {command.split()[1] for command in commands}
    assert groups >= {
        "trace",
        "predict",
        "perf",
        "profile",
        "plan",
        "simulate",
        "train",
        "models",
        "advise",
    }
    assert [c.split()[:3] for c in _make_run_commands()][-1] == ["liveput", "simulate", "--trace"]


def _run_as_written(command: str, folder: Path) -> None:
    argv = shlex.split(command)
    done = subprocess.run(
        [str(LIVEPUT), *argv[1:]],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, f"{command}: exit {done.returncode}: {done.stderr[-2000:]}"
    assert "Traceback" not in done.stderr, command
    if "--json" in argv:
        assert isinstance(json.loads(done.stdout), dict), command


@pytest.mark.process
def test_every_readme_command_runs_as_written(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()  # as `make run` does
    first, *rest = [*_make_run_commands(), *_readme_commands()]
    # The first command writes the trace the others read; the others read nothing another writes,
    # so two at a time (the machine's two cores; each is one process, mostly on one core).
    _run_as_written(first, tmp_path)
    with ThreadPoolExecutor(max_workers=2) as pool:
        for future in [pool.submit(_run_as_written, command, tmp_path) for command in rest]:
            future.result()
    assert json.loads((tmp_path / "out" / "run.json").read_text())["exactly_once"] is True


def _all_commands() -> list[tuple[str, object]]:
    pending = [("liveput", _command())]
    found = []
    while pending:
        path, command = pending.pop()
        found.append((path, command))
        pending.extend(
            (f"{path} {name}", sub) for name, sub in getattr(command, "commands", {}).items()
        )
    return found


@pytest.mark.parametrize("path", [path for path, _ in _all_commands()])
def test_help_shows_no_value_for_flags(path: str, capsys: pytest.CaptureFixture[str]) -> None:
    from liveput.cli.main import main

    assert main([*path.split()[1:], "--help"]) == 0
    text = capsys.readouterr().out
    assert "--help" in text and "<bool>" not in text, path


def test_progress_shows_on_a_terminal_unless_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console

    from liveput.cli import output
    from liveput.cli.main import main

    monkeypatch.setattr(output, "err_console", Console(stderr=True, force_terminal=True))
    assert not output.progress().disable
    monkeypatch.setattr(output, "err_console", Console(stderr=True, force_terminal=False))
    assert output.progress().disable  # a pipe or a log file gets no bar frames
    monkeypatch.setattr(output, "err_console", Console(stderr=True, force_terminal=True))
    try:
        assert main(["--quiet", "models", "--json"]) == 0
        assert output.progress().disable
    finally:
        output.set_quiet(False)
