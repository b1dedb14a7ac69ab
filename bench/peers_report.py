"""The peers benchmark's output: the table, the ``--json`` document and the plot.

``--json`` writes ``{"traces": [{"trace": name, "systems": {system: {"samples": n, ...}},
"simulated": {"liveput": n, "liveput-restart": n}}]}`` (field names fixed for scripts); a system
that could not run has ``"samples": null`` and an ``"error"``. Each system's
``"downtime_by_event_kind"`` maps ``loss``, ``total-loss`` and ``arrival`` to ``{"events",
"median_s", "p95_s", "each_s"}`` (``bench.peers_events`` defines them). ``"bound_samples"``:
liveput's configuration bound on the trace here (``peers_sim.upper_bound``: every instance at
liveput's best rate for that many, each rate its run's steady rate past its warm-up,
``bench.peers_rates``; nothing lost), when the rates were measured. The document's
``"liveput_samples_per_s_by_instances"`` holds those rates (``{"4": samples/s, ...}``) and
``"liveput_steady_rate_by_instances"`` how each measured one was taken
(``peers_rates.SteadyRate.to_json``: the steps skipped, ``"warm_up_left_in"`` where the run had
too few steps past its warm-up, the rate from its first step beside it, the run's timeline).
``"stopped"``: why a system trained nothing or stopped before the window's end,
from its own logs (:class:`bench.peers_stops.Stop`), or null.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

from bench.peers_events import KINDS, by_kind, event_downtimes, trace_events
from bench.peers_run import SystemRun
from bench.peers_stops import Stop

SYSTEMS = (
    "liveput",
    "liveput-restart",
    "torchrun",
    "torchrun-notice",
    "torchft",
    "torchrun-fsdp",
    "torchft-hsdp",
    "torchrun-pp",
    "torchrun-pp-notice",
)
SIMULATED = ("liveput", "liveput-restart")

MIN_STEPS = 50
"""Steps (redone ones included) each run of a system that trains should take in its window, so
that one step either way moves a ratio by 2 % at most; the table names the systems short of it."""

Outcome = SystemRun | str
"""A run, or why the system could not run."""
TraceResult = tuple[str, Mapping[str, Outcome | Sequence[Outcome]], Mapping[str, float]]
"""(trace name, outcome or repetitions' outcomes per system, simulated samples per shared
policy)."""


def _system_entry(run: Outcome, base: float | None, steady: float | None) -> dict:
    if isinstance(run, str):
        return {"samples": None, "error": run, "no_preemption_samples_per_s": steady}
    downtimes = run.downtimes_s()
    return {
        "samples": int(run.samples),
        "ratio_to_liveput": round(run.samples / base, 4) if base else None,
        "samples_min": int(run.samples),
        "samples_max": int(run.samples),
        "downtime_per_event_s": [round(d, 2) for d in downtimes],
        "mean_downtime_s": round(statistics.mean(downtimes), 2) if downtimes else None,
        "downtime_by_event_kind": _by_event_kind(run),
        "steps": len(run.steps()),
        "restarts_or_migrations": int(run.restarts),
        "final_loss": None if run.final_loss is None else round(float(run.final_loss), 4),
        "no_preemption_samples_per_s": steady,
        "timeline": [[round(t, 2), int(s)] for t, s in run.timeline],
        "kills_s": [round(t, 2) for t in run.kills_s],
        "launches_s": [round(t, 2) for t in run.launches_s],
        "stopped": run.stopped,
        "checkpoint_every_steps": run.extra.get("checkpoint_every_steps"),
    }


def _by_event_kind(run: SystemRun) -> dict[str, dict]:
    """``peers_events.by_kind`` of the run's trace events, on its timeline."""
    events = trace_events(run.initial_instances, run.kills_s, run.launches_s)
    end_s = max([run.timeline[-1][0] if run.timeline else 0.0, *(e.at_s for e in events)])
    return by_kind(events, event_downtimes(events, run.timeline, end_s))


def to_json_document(
    results: Sequence[TraceResult], steady: Mapping[str, float] | None = None
) -> dict:
    """The ``--json`` document; ``steady``: each system's samples/s with no preemption.

    A system run more than once (``--repeats``) gives its median run's figures, ``samples``
    the median of its runs' samples, ``samples_min`` and ``samples_max``, and ``runs``: each
    repetition's own figures, in the order they ran. Ratios divide medians of the same
    benchmark run."""
    steady = steady or {}
    traces = []
    for name, runs, simulated in results:
        repeated = {system: _as_list(outcome) for system, outcome in runs.items()}
        liveput = median_samples(repeated.get("liveput", []))
        traces.append(
            {
                "trace": name,
                "systems": {
                    system: _repeated_entry(repeated[system], liveput, steady.get(system))
                    for system in SYSTEMS
                    if system in repeated
                },
                "simulated": {
                    policy: int(round(simulated[policy]))
                    for policy in SIMULATED
                    if policy in simulated
                },
            }
        )
        if "bound" in simulated:
            traces[-1]["bound_samples"] = int(round(simulated["bound"]))
    return {"traces": traces}


def _as_list(outcome: Outcome | Sequence[Outcome]) -> list[Outcome]:
    return [outcome] if isinstance(outcome, SystemRun | str) else list(outcome)


def median_run(outcomes: Sequence[Outcome]) -> Outcome:
    """The run at the median of the runs' samples (the lower of the middle two of an even
    count), a run that could not run counted below every run that did."""
    ran = sorted((o for o in outcomes if isinstance(o, SystemRun)), key=lambda r: r.samples)
    ordered: list[Outcome] = [o for o in outcomes if isinstance(o, str)] + list(ran)
    return ordered[(len(ordered) - 1) // 2]


def median_samples(outcomes: Sequence[Outcome]) -> float | None:
    """The median of the runs' samples (a run that could not run counts 0); None: none ran."""
    if not any(isinstance(o, SystemRun) for o in outcomes):
        return None
    return statistics.median(o.samples if isinstance(o, SystemRun) else 0 for o in outcomes)


def _repeated_entry(outcomes: list[Outcome], liveput: float | None, steady: float | None) -> dict:
    entry = _system_entry(median_run(outcomes), liveput, steady)
    median = median_samples(outcomes)
    if entry["samples"] is not None and median is not None:
        samples = [o.samples if isinstance(o, SystemRun) else 0 for o in outcomes]
        entry["samples"] = int(round(median))
        entry["samples_min"], entry["samples_max"] = min(samples), max(samples)
        entry["ratio_to_liveput"] = round(median / liveput, 4) if liveput else None
    entry["runs"] = [_run_entry(o) for o in outcomes]
    return entry


RUN_FIELDS = (
    "samples",
    "steps",
    "mean_downtime_s",
    "restarts_or_migrations",
    "final_loss",
    "stopped",
)
"""What ``runs`` keeps of each repetition (its system entry's fields of the same names)."""


def _run_entry(outcome: Outcome) -> dict:
    if isinstance(outcome, str):
        return {"samples": None, "error": outcome}
    entry = _system_entry(outcome, None, None)
    return {field: entry[field] for field in RUN_FIELDS}


def table(document: dict) -> str:
    """The figures, one block per trace."""
    lines = []
    for entry in document["traces"]:
        lines.append(f"trace {entry['trace']}")
        lines.append(
            f"  {'system':<20}{'samples':>9}{'min-max':>15}{'/liveput':>10}{'simulated':>11}"
            f"{'down s/event':>14}{'restarts':>10}{'final loss':>12}"
            f"{'no-preempt/s':>14}"
        )
        for system, figures in entry["systems"].items():
            steady = figures.get("no_preemption_samples_per_s")
            steady_text = "-" if steady is None else f"{steady:.1f}"
            if figures["samples"] is None:
                lines.append(f"  {system:<20}{'-':>9}  could not run: {figures['error']}")
                continue
            simulated = entry["simulated"].get(system)
            ratio = figures["ratio_to_liveput"]
            down = figures["mean_downtime_s"]
            loss = figures["final_loss"]
            spread = f"{figures['samples_min']}-{figures['samples_max']}"
            lines.append(
                f"  {system:<20}{figures['samples']:>9}{spread:>15}"
                f"{'-' if ratio is None else f'{ratio:.2f}':>10}"
                f"{'-' if simulated is None else str(simulated):>11}"
                f"{'-' if down is None else f'{down:.1f}':>14}"
                f"{figures['restarts_or_migrations']:>10}"
                f"{'-' if loss is None else f'{loss:.3f}':>12}{steady_text:>14}"
            )
        few = {
            system: min(run["steps"] for run in figures["runs"] if run["samples"] is not None)
            for system, figures in entry["systems"].items()
            if figures["samples"] and figures.get("runs")
        }
        few = {system: steps for system, steps in few.items() if steps < MIN_STEPS}
        if few:
            lines.append(
                f"  fewer than {MIN_STEPS} steps in a run's window (one step either way moves a "
                "ratio): " + ", ".join(f"{system} {steps}" for system, steps in few.items())
            )
        for system, figures in entry["systems"].items():
            if figures.get("stopped"):
                lines.append(f"  {system} stopped: {Stop(**figures['stopped']).describe()}")
        lines.extend(_event_kind_lines(entry["systems"]))
        if "bound_samples" in entry:
            lines.append(
                f"  liveput's configuration bound: {entry['bound_samples']} samples (every "
                "instance at liveput's best rate for that many, measured past each run's "
                "warm-up; nothing lost)"
            )
            lines.extend(_warm_up_left_in(document))
    return "\n".join(lines)


def _warm_up_left_in(document: dict) -> list[str]:
    """A line naming the instance counts whose rate kept its run's start-up (too few steps past
    the warm-up), so that the bound is not read as built on steady rates alone."""
    how = document.get("liveput_steady_rate_by_instances", {})
    short = {n: h["steps"] for n, h in how.items() if h.get("warm_up_left_in")}
    if not short:
        return []
    return [
        "  rates with their run's start-up left in (too few steps past the warm-up): "
        + ", ".join(f"{n} instances ({steps} steps)" for n, steps in short.items())
    ]


def _event_kind_lines(systems: Mapping[str, dict]) -> list[str]:
    """Downtime per event kind, the systems side by side: median / p95 s (events measured)."""
    ran = {name: f for name, f in systems.items() if f.get("downtime_by_event_kind") is not None}
    kinds = [k for k in KINDS if any(k in f["downtime_by_event_kind"] for f in ran.values())]
    if not kinds:
        return []
    lines = [
        "  downtime per event kind, median / p95 s (events):",
        f"  {'kind':<16}" + "".join(f"{name:>20}" for name in ran),
    ]
    for kind in kinds:
        cells = []
        for figures in ran.values():
            got = figures["downtime_by_event_kind"].get(kind)
            if got is None or got["median_s"] is None:
                cells.append(f"{'-':>20}")
            else:
                text = f"{got['median_s']:.1f} / {got['p95_s']:.1f} ({got['events']})"
                cells.append(f"{text:>20}")
        lines.append(f"  {kind:<16}" + "".join(cells))
    return lines


def plot(document: dict, path: Path) -> None:
    """Samples over time per system, one panel per trace, kills (dashed) and additions (dotted)
    marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traces = document["traces"]
    figure, axes = plt.subplots(1, len(traces), figsize=(6.5 * len(traces), 4), squeeze=False)
    for axis, entry in zip(axes[0], traces, strict=True):
        marked = False
        for system, figures in entry["systems"].items():
            if figures["samples"] is None:
                continue
            times = [t for t, _ in figures["timeline"]]
            samples = [s for _, s in figures["timeline"]]
            axis.step(times, samples, where="post", label=system)
            if not marked:
                for kill in figures["kills_s"]:
                    axis.axvline(kill, color="black", alpha=0.5, linestyle="--")
                for launch in figures["launches_s"]:
                    axis.axvline(launch, color="gray", alpha=0.6, linestyle=":")
                marked = True
        axis.set_title(f"{entry['trace']} (dashed: preemption, dotted: new instance)", fontsize=9)
        axis.set_xlabel("wall seconds since the cloud started")
        axis.set_ylabel("samples trained")
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


HUNG_S = 60.0
"""Wall seconds an instance was held without the system taking a step after which its run
counts as broken (a crash loop or a hang, not a slow restart): no verdict is drawn from it."""


def broken(figures: dict) -> str:
    """Why a system's median run cannot carry a ratio ('' when it can): it trained nothing, or
    it stopped while an instance was held :data:`HUNG_S` or longer."""
    if figures.get("samples") == 0:
        return "trained nothing"
    stopped = figures.get("stopped")
    if stopped and stopped["held_after_s"] >= HUNG_S:
        return f"stopped: {Stop(**stopped).describe()}"
    return ""


def verdicts(document: dict, targets: tuple[tuple[str, float], ...]) -> None:
    for entry in document["traces"]:
        systems, simulated = entry["systems"], entry["simulated"]
        live = systems.get("liveput", {}).get("samples")
        for peer, target in targets:
            other = systems.get(peer, {}).get("samples")
            unfit = [s for s in ("liveput", peer) if broken(systems.get(s, {}))]
            if live is not None and other is not None and unfit:
                # A ratio to a run that crashed or hung measures the harness, not the systems.
                print(
                    f"{entry['trace']}: liveput / {peer}: NO VERDICT, "
                    + "; ".join(f"{s} {broken(systems[s])}" for s in unfit)
                )
            elif live and other:
                ratio = live / other
                bound = entry.get("bound_samples")
                reach = (
                    ""
                    if bound is None or bound >= target * other
                    else (
                        f"; out of reach here: {target} x {other} > liveput's configuration "
                        f"bound, {bound}"
                    )
                )
                print(
                    f"{entry['trace']}: liveput / {peer} = {ratio:.2f} (target >= {target}): "
                    f"{'PASS' if ratio >= target else 'FAIL'}{reach}"
                )
        for system, predicted in simulated.items():
            real = systems.get(system, {}).get("samples")
            if real:
                error = predicted / real - 1
                print(
                    f"{entry['trace']}: simulator / runtime for {system} = {predicted} / "
                    f"{real} ({error * 100:+.0f} %, target within 10 %): "
                    f"{'PASS' if abs(error) <= 0.10 else 'FAIL'}"
                )
