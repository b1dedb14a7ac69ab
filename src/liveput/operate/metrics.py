"""The job's figures for other tools: Prometheus text exposition and TensorBoard scalars.

Both are made from the status snapshot the store holds (:mod:`liveput.operate.recorder`), so
what Prometheus scrapes, what TensorBoard plots and what ``liveput status`` prints agree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from liveput.errors import LiveputError
from liveput.operate.recorder import INSTANCE_STATES, MARKETS, read_status
from liveput.runtime.store import Store, readers


class _StatusCollector:
    """One scrape's metrics from one status snapshot."""

    def __init__(self, status: dict, migrations: dict[str, int]) -> None:
        self.status = status
        self.migrations = migrations

    def collect(self) -> Iterator[Metric]:  # prometheus_client's collector protocol
        status = self.status
        job = status.get("job", "")
        gauges = (
            ("liveput_step", "Steps committed", status.get("step", 0)),
            (
                "liveput_samples_per_second",
                "Samples per second now",
                status.get("samples_per_s", 0.0),
            ),
            (
                "liveput_samples_per_second_avg",
                "Samples per second averaged",
                status.get("samples_per_s_avg", 0.0),
            ),
        )
        for name, text, value in gauges:
            family = GaugeMetricFamily(name, text, labels=["job"])
            family.add_metric([job], float(value))
            yield family
        if status.get("loss") is not None:
            family = GaugeMetricFamily(
                "liveput_loss", "Loss of the last committed step", labels=["job"]
            )
            family.add_metric([job], float(status["loss"]))
            yield family
        shown = status.get("eval") or {}
        if shown.get("metrics"):
            evaluation = GaugeMetricFamily(
                "liveput_eval",
                "The newest evaluation's metrics (Job.evaluate)",
                labels=["job", "name"],
            )
            for name, value in shown["metrics"].items():
                evaluation.add_metric([job, name], float(value))
            yield evaluation
            step = GaugeMetricFamily(
                "liveput_eval_step", "Steps committed at the newest evaluation", labels=["job"]
            )
            step.add_metric([job], float(shown["step"] + 1))
            yield step
        instances = GaugeMetricFamily(
            "liveput_instances", "Instances by market and state", labels=["job", "market", "state"]
        )
        # Every market and state, 0 included: a job whose instances are all gone (preempted,
        # the next not yet joined) is a series at 0 a query sees, not a series missing.
        counted = status.get("instances", {})
        for market in MARKETS:
            for state in INSTANCE_STATES:
                count = counted.get(market, {}).get(state, 0)
                instances.add_metric([job, market, state], float(count))
        yield instances
        usd = CounterMetricFamily(
            "liveput_usd", "Dollars spent by market", labels=["job", "market"]
        )
        for market in ("spot", "on_demand"):
            usd.add_metric(
                [job, market.replace("_", "-")], float(status.get("usd", {}).get(market, 0.0))
            )
        yield usd
        saved = GaugeMetricFamily(
            "liveput_usd_saved", "Dollars saved against on-demand", labels=["job"]
        )
        saved.add_metric([job], float(status.get("usd", {}).get("savings", 0.0)))
        yield saved
        migrations = CounterMetricFamily(
            "liveput_migrations", "Plans published by migration kind", labels=["job", "kind"]
        )
        for kind, count in sorted(self.migrations.items()):
            migrations.add_metric([job, kind], float(count))
        yield migrations
        downtime = CounterMetricFamily(
            "liveput_downtime_seconds",
            "Wall seconds from a plan to its first commit, summed",
            labels=["job"],
        )
        downtime.add_metric([job], float(status.get("downtime_s", 0.0)))
        yield downtime


def prometheus_text(store: Store) -> bytes:
    """The job's metrics in Prometheus' text format, read from its store."""
    status = read_status(store, events=0)
    migrations = readers.migrations(store)
    registry = CollectorRegistry()
    registry.register(_StatusCollector(status, migrations))
    return generate_latest(registry)


def step_losses(store: Store, epoch: int, after_step: int, last_step: int) -> dict[int, float]:
    """The loss of every committed step ``after_step + 1 .. last_step`` (0-based) of ``epoch``,
    from the ledger's records (a step whose record is gone, folded or pruned, is left out)."""
    import json

    from liveput.runtime import keys

    losses: dict[int, float] = {}
    for step in range(max(after_step + 1, 0), last_step + 1):
        raw = store.get(keys.ledger_record(epoch, step))
        if raw is not None and json.loads(raw).get("loss") is not None:
            losses[step] = float(json.loads(raw)["loss"])
    return losses


def step_evaluations(
    store: Store, due: Callable[[int], bool], after_step: int, status: dict
) -> dict[int, dict]:
    """The evaluations (0-based step -> record) of the steps after ``after_step`` that ``due``
    names, up to the newest one the status shows (one read each, only once it is new)."""
    from liveput.runtime.store import readers

    shown = status.get("eval")
    if shown is None or shown["step"] <= after_step:
        return {}
    steps = [s for s in range(max(after_step + 1, 0), shown["step"] + 1) if due(s)]
    return readers.evaluations(store, steps)


class TensorBoardScalars:
    """Writes the loss of every committed step, each evaluation's metrics (``eval/<name>``),
    and samples/s, instances and dollars as the status changes (TensorBoard's event files,
    through ``torch.utils.tensorboard``) to a local directory. TensorBoard's step is the number
    of steps done (0-based step ``s`` is ``s + 1``)."""

    def __init__(self, directory: str) -> None:
        from torch.utils.tensorboard import SummaryWriter

        try:
            Path(directory).mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise LiveputError(
                f"metrics.tensorboard: cannot create {directory}: {error.strerror}"
            ) from None
        self.writer = SummaryWriter(log_dir=directory)
        self._step = -1
        self.loss_step = -1
        """The newest step (0-based) whose loss was written."""
        self.eval_step = -1
        """The newest step (0-based) whose evaluation was written."""

    def add_evaluations(self, evaluations: dict[int, dict]) -> None:
        """Each evaluation's metrics (0-based step -> ``eval/<s>`` record) newer than the last
        written, as ``eval/<name>`` at its step; a failed one writes nothing."""
        for step, record in sorted(evaluations.items()):
            if step <= self.eval_step:
                continue
            for name, value in record.get("metrics", {}).items():
                self.writer.add_scalar(f"eval/{name}", float(value), global_step=step + 1)
            self.eval_step = step
        self.writer.flush()

    def add(self, status: dict, losses: dict[int, float] | None = None) -> None:
        """The status's figures at its step, and ``losses`` (step -> loss, 0-based) of the steps
        committed since the last call (without them, the status's loss at its step)."""
        for step, loss in sorted((losses or {}).items()):
            if step > self.loss_step:
                self.writer.add_scalar("loss", loss, global_step=step + 1)
                self.loss_step = step
        step = int(status.get("step", 0))
        if step == self._step:
            self.writer.flush()
            return
        self._step = step
        scalars = {
            "samples_per_s": status.get("samples_per_s"),
            "loss": None if losses is not None else status.get("loss"),
            "usd/total": status.get("usd", {}).get("total"),
            "usd/savings": status.get("usd", {}).get("savings"),
        }
        for market, states in status.get("instances", {}).items():
            scalars[f"instances/{market}"] = sum(states.values())
        for tag, value in scalars.items():
            if value is not None:
                self.writer.add_scalar(tag, float(value), global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
