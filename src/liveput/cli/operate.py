"""`liveput launch|status|stop|resume`: run a job from its job file and watch it from its store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.live import Live
from rich.table import Table

from liveput.cli import params
from liveput.cli.output import console, device_counts, err_console, print_json
from liveput.errors import LiveputError
from liveput.runtime import keys

if TYPE_CHECKING:
    from liveput.operate.jobfile import JobFile
    from liveput.operate.runner import JobPlace
    from liveput.runtime.store import Store


def _job(path: Path) -> JobFile:
    from liveput.operate.jobfile import load_job_file

    return load_job_file(path)


def launch(
    job_file: Path = typer.Argument(..., help="The job file (YAML; see docs/operate.md)."),
    detach: bool = typer.Option(
        False,
        "--detach",
        metavar=params.FLAG,
        help="Return once the job runs; it goes on in the background.",
    ),
    as_json: bool = typer.Option(
        False,
        "--json",
        metavar=params.FLAG,
        help="Print one JSON object: with --detach, where the job is "
        "(store, token_file, dashboard); else the run's summary.",
    ),
    background: bool = typer.Option(False, "--background", hidden=True),
) -> None:
    """Start a job from its file: its store (a local etcd), coordinator, emulated provider and
    agents, dashboard and metrics. In the foreground it returns when the job ends; detached, the
    store stays readable after the end (linger_s). The last status stays in the job's folder."""
    job = _job(job_file)
    if detach:
        _detach(["launch", str(job_file)], job, as_json)
        return
    _run(job, resume=False, as_json=as_json, linger=background)


def resume(
    job_file: Path = typer.Argument(None, help="The job file it was launched from."),
    store: str = typer.Option(
        None, "--store", help="Or the job's store URL (the job file is kept there)."
    ),
    token_file: Path = typer.Option(None, "--token-file", help="Job token file (with --store)."),
    as_json: bool = typer.Option(
        False,
        "--json",
        metavar=params.FLAG,
        help="Print one JSON object: with --detach, where the job is; else the run's summary.",
    ),
    detach: bool = typer.Option(
        False,
        "--detach",
        metavar=params.FLAG,
        help="Return once the job runs again; it goes on in the background.",
    ),
    background: bool = typer.Option(False, "--background", hidden=True),
) -> None:
    """Continue a job whose coordinator and agents are all gone, from its store and newest
    complete checkpoint; returns when the job ends (or, with --detach, once it runs)."""
    from liveput.operate.jobfile import parse_job_file

    if (job_file is None) == (store is None):
        raise LiveputError("resume: give the job file or --store URL")
    if job_file is not None:
        job = _job(job_file)
    else:
        with _open(store, token_file, None) as handle:
            raw = handle.get(keys.job_file())
        if raw is None:
            raise LiveputError(f"resume: store {store} holds no job file (not a launched job)")
        kept = json.loads(raw)
        job = parse_job_file(kept["text"], kept["path"])
        import dataclasses

        job = dataclasses.replace(job, state_dir=kept["state_dir"])
    if detach:
        where = [str(job_file)] if job_file is not None else ["--store", store]
        if token_file is not None:
            where += ["--token-file", str(token_file)]
        _detach(["resume", *where], job, as_json)
        return
    _run(job, resume=True, as_json=as_json, linger=background)


def _run(job: JobFile, resume: bool, as_json: bool, linger: bool) -> None:
    import signal

    from liveput.cli.train import _summary_table
    from liveput.operate.runner import run_job

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # the launcher's cleanup runs: no store or agent left behind

    signal.signal(signal.SIGTERM, interrupted)

    def ready(place: JobPlace) -> None:
        watch = f"liveput status --store {place.store} --token-file {place.token_file}"
        err_console.print(
            f"job {job.job_name} {'resumed' if resume else 'running'}; watch: "
            f"{watch} --watch" + (f"; dashboard: {place.dashboard}" if place.dashboard else ""),
            soft_wrap=True,
        )
        _keep_job_file(job, place)

    summary = run_job(job, resume=resume, on_ready=ready, linger=linger)
    if as_json:
        print_json(summary)
    else:
        console.print(_summary_table(summary))
        err_console.print(f"model: {summary['model']}", soft_wrap=True)


def _keep_job_file(job: JobFile, place: JobPlace) -> None:
    """The job file in the store, so that ``resume --store`` needs nothing else."""
    from liveput.runtime.store import open_store

    token = Path(place.token_file).read_text().strip()
    with open_store(place.store, token=token, timeout_s=5.0) as store:
        store.set(
            keys.job_file(),
            json.dumps(
                {
                    "text": Path(job.path).read_text()
                    if job.path and Path(job.path).exists()
                    else "",
                    "path": job.path,
                    "state_dir": str(job.state_path.resolve()),
                }
            ).encode(),
        )


def _detach(command: list[str], job: JobFile, as_json: bool) -> None:
    from liveput.operate.runner import read_place
    from liveput.runtime.store import open_store

    state_dir = job.state_path
    state_dir.mkdir(parents=True, exist_ok=True)
    log_path = state_dir / "launch.log"
    with open(log_path, "ab") as log:
        child = subprocess.Popen(
            [sys.executable, "-m", "liveput.cli.main", "--verbose", *command, "--background"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    deadline = time.monotonic() + 300.0
    while time.monotonic() < deadline:
        code = child.poll()
        if code is not None:
            lines = log_path.read_text(errors="replace").strip().splitlines()
            errors = [line for line in lines if line.startswith("error: ")]
            raise LiveputError(
                (
                    errors[-1]
                    if errors
                    else (lines[-1] if lines else f"the launcher exited with code {code}")
                ).removeprefix("error: ")
            )
        place = read_place(state_dir)
        if place is not None and place.pid == child.pid:
            token = Path(place.token_file).read_text().strip()
            try:
                with open_store(place.store, token=token, timeout_s=5.0) as store:
                    if (
                        store.get(keys.status_now()) is not None
                        and store.get(keys.job_file()) is not None
                    ):
                        break
            except LiveputError:
                pass
        time.sleep(0.2)
    else:
        raise LiveputError(f"launch: the job did not start in 300 s; see {log_path}")
    if as_json:
        print_json(place.public())
    else:
        err_console.print(
            f"job {job.job_name} runs in the background (pid {child.pid}, log "
            f"{log_path}); watch: liveput status --store {place.store} "
            f"--token-file {place.token_file} --watch",
            soft_wrap=True,
        )


def _token(token: str | None, token_file: Path | None, fallback: str | None) -> str:
    if token:
        return token
    if token_file is not None:
        try:
            return token_file.read_text().strip()
        except OSError as error:
            raise LiveputError(f"--token-file {token_file}: {error.strerror}") from None
    if os.environ.get("LIVEPUT_TOKEN"):
        return os.environ["LIVEPUT_TOKEN"]
    if fallback:
        return Path(fallback).read_text().strip()
    raise LiveputError("a job token is required: --token, --token-file or LIVEPUT_TOKEN")


def _open(
    store: str | None, token_file: Path | None, token: str | None, job_file: Path | None = None
) -> Store:
    from liveput.operate.runner import read_place
    from liveput.runtime.store import open_store

    fallback = None
    if store is None:
        if job_file is None:
            store = os.environ.get("LIVEPUT_STORE")
            if store is None:
                raise LiveputError("give the job file or --store URL (liveput launch printed it)")
        else:
            job = _job(job_file)
            place = read_place(job.state_path)
            if place is None:
                raise LiveputError(f"{job_file}: no launched job in {job.state_path}")
            store, fallback = place.store, place.token_file
    handle = open_store(store, token=_token(token, token_file, fallback), timeout_s=5.0)
    try:
        handle.get(keys.job_spec())  # reach it now: an unreachable store or wrong token, one line
    except LiveputError:
        handle.close()
        raise
    return handle


def status(
    job_file: Path = typer.Argument(None, help="The job file (or give --store)."),
    store: str = typer.Option(None, "--store", help="The job's store URL."),
    token_file: Path = typer.Option(None, "--token-file", help="File holding the job token."),
    token: str = typer.Option(None, "--token", help="The job token (or LIVEPUT_TOKEN)."),
    watch: bool = typer.Option(
        False, "--watch", metavar=params.FLAG, help="Refresh in place until the job ends."
    ),
    as_json: bool = typer.Option(
        False, "--json", metavar=params.FLAG, help="Print one JSON object."
    ),
    events: int = typer.Option(
        10, "--events", parser=params.SOME_INSTANCES, help="Newest events shown."
    ),
) -> None:
    """How a job is doing, from its store alone: configuration, instances, speed, loss,
    dollars, ETA and its last events with their reasons (plans, losses and notices before
    checkpoints). Once a job has ended and its store is gone, from the job's folder."""
    from liveput.operate.recorder import read_status

    kept = _kept_status(job_file, store, events)
    if kept is not None:
        if as_json:
            print_json(kept)
        else:
            console.print(_status_view(kept))
        return
    try:
        with _open(store, token_file, token, job_file) as handle:
            if watch and not as_json:
                snapshot = _stale(read_status(handle, events))
                with Live(_status_view(snapshot), console=console, auto_refresh=False) as live:
                    while snapshot["state"] not in ("finished", "failed"):
                        time.sleep(1.0)
                        snapshot = _stale(read_status(handle, events))
                        live.update(_status_view(snapshot), refresh=True)
                return
            snapshot = _stale(read_status(handle, events))
    except LiveputError:
        # The job may have ended, and its store stopped, since the look above: its folder
        # has the last status (written before the store stops).
        ended = _kept_status(job_file, store, events)
        if ended is None:
            raise
        snapshot = ended
    if as_json:
        print_json(snapshot)
    else:
        console.print(_status_view(snapshot))


def _kept_status(job_file: Path | None, store: str | None, events: int) -> dict | None:
    """The ended job's last status from its folder, when its store no longer answers (None:
    ask the store, which is newer while it is up: a lingering or resumed job's)."""
    from liveput.operate.runner import read_kept_status, read_place, store_running

    if job_file is None or store is not None:
        return None
    state_dir = _job(job_file).state_path
    kept = read_kept_status(state_dir, events)
    if kept is None:
        return None
    place = read_place(state_dir)
    if place is None or not store_running(place):
        kept["stale_s"] = None
        return kept
    try:
        with _open(None, None, None, job_file) as handle:
            handle.get(keys.status_now())
        return None
    except LiveputError:
        kept["stale_s"] = None
        return kept


STALE_S = 30.0
"""A running job whose status has not changed for this long may have lost its launcher."""


def _stale(snapshot: dict) -> dict:
    """``stale_s``: seconds since a running job's status last changed, when that is long."""
    age_s = time.time() - snapshot.get("updated_unix_s", time.time())
    snapshot["stale_s"] = (
        round(age_s, 1) if snapshot["state"] == "running" and age_s > STALE_S else None
    )
    return snapshot


def _status_view(s: dict) -> Table:
    if s.get("stale_s"):
        s = {
            **s,
            "reason": f"no update for {s['stale_s']:.0f} s: its launcher may be gone "
            "(liveput resume continues it)",
        }
    view = Table(
        title=f"job {s['job']}: {s['state']}" + (f" ({s['reason']})" if s["reason"] else ""),
        show_header=False,
    )
    view.add_column("what")
    view.add_column("value")
    instances = "; ".join(
        f"{market}: " + (", ".join(f"{n} {state}" for state, n in sorted(states.items())) or "0")
        for market, states in s["instances"].items()
    )
    usd = s["usd"]
    rows = [
        ("step", f"{s['step']:,} / {s['steps_total']:,} ({s['samples']:,} samples)"),
        ("doing", s["activity"]),
        ("configuration (D x P)", s["configuration"]),
        ("instances", instances),
        ("devices", device_counts(s.get("devices", {}))),
        ("samples/s now / avg", f"{s['samples_per_s']:.1f} / {s['samples_per_s_avg']:.1f}"),
        ("loss", "-" if s["loss"] is None else f"{s['loss']:.4f}"),
        ("evaluation", _evaluation_text(s.get("eval"))),
        (
            "dollars (spot / on-demand)",
            f"${usd['total']:.2f} (${usd['spot']:.2f} / ${usd['on_demand']:.2f})",
        ),
        ("saved against on-demand", f"${usd['savings']:.2f} of ${usd['on_demand_equivalent']:.2f}"),
        ("ETA", "-" if s["eta_s"] is None else f"{s['eta_s']:.0f} s"),
    ]
    if s.get("checkpoints_failed"):
        rows.append(("checkpoints failed", f"{s['checkpoints_failed']} (see the events)"))
    if s.get("deadline_hours") is not None:
        slack = s.get("deadline_slack_hours")
        rows.append(
            (
                "deadline",
                f"{s['deadline_hours']:g} h, slack " + ("-" if slack is None else f"{slack:.3f} h"),
            )
        )
    for event in s["events"]:
        detail = {k: v for k, v in event.items() if k not in ("time_s", "unix_s", "kind", "reason")}
        rows.append(
            (
                f"{event['time_s']:.1f} s {event['kind']}",
                f"{event.get('reason', '')} {json.dumps(detail) if detail else ''}",
            )
        )
    for what, value in rows:
        view.add_row(what, value)
    return view


def _evaluation_text(shown: dict | None) -> str:
    """The newest evaluation's row: after how many steps, its metrics or why it failed."""
    from liveput.operate.recorder import format_metrics

    if shown is None:
        return "-"
    what = f"failed: {shown['error']}" if "error" in shown else format_metrics(shown["metrics"])
    return f"after {shown['step'] + 1:,} steps: {what}"


def stop(
    job_file: Path = typer.Argument(None, help="The job file (or give --store)."),
    store: str = typer.Option(None, "--store", help="The job's store URL."),
    token_file: Path = typer.Option(None, "--token-file", help="File holding the job token."),
    token: str = typer.Option(None, "--token", help="The job token (or LIVEPUT_TOKEN)."),
) -> None:
    """Stop a job: a running one ends (its data stays for a resume); a finished one's store,
    kept readable for status, goes."""
    from liveput.operate.runner import read_place, stop_job

    place, state_dir = None, None
    if job_file is not None:
        state_dir = _job(job_file).state_path
        place = read_place(state_dir)
        if _kept_status(job_file, store, 0) is not None:
            err_console.print("the job has ended and its store is gone: nothing to stop")
            return
    with _open(store, token_file, token, job_file) as handle:
        ended = stop_job(handle, place, state_dir)
    err_console.print("stopped" if ended else "asked to stop; the launcher has not ended yet")


def register(app: typer.Typer) -> None:
    for command in (launch, status, stop, resume):
        app.command(command.__name__)(command)
