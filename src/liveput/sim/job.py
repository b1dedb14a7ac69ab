"""The simulated job: its running configuration, the time still lost to a move and to re-done
work, its samples and dollars (the state every objective's replay shares)."""

from __future__ import annotations

from liveput.perf.configuration import Configuration
from liveput.perf.types import ConfigTable, Measurement
from liveput.policies import Decision, PolicyContext


class InvariantError(AssertionError):
    """The simulator found its own state impossible (a bug, never bad input)."""


class SimulatedJob:
    """One policy's job in a replay: what runs, what is still owed to a move, what it trained
    and paid (``cost_usd``: through :meth:`bill`; an objective may keep its own bill)."""

    def __init__(
        self, context: PolicyContext, num_on_demand: int, actual: ConfigTable | None = None
    ) -> None:
        self.grid = (actual or context.table).throughput_grid(context.max_instances)
        self.costs = context.costs
        self.spot_usd_per_s = context.spot_price_usd_per_hour / 3600.0
        self.on_demand_usd_per_s = context.on_demand_price_usd_per_hour / 3600.0
        self.current: Configuration | None = None
        self.used = 0
        self.num_on_demand = num_on_demand
        self.factor = 1.0
        self.moving_s = 0.0
        self.redo_s = 0.0
        self.samples = 0.0
        self.cost_usd = 0.0
        self.downtime_s = 0.0
        self.reconfigurations = 0
        self.clock_s = 0.0

    def apply(self, decision: Decision, num_available: int, time_s: float) -> None:
        """Adopt a decision, checking that it fits what is there."""
        if time_s < self.clock_s - 1e-9:
            raise InvariantError(f"clock went back from {self.clock_s} s to {time_s} s")
        self.clock_s = time_s
        if decision.num_on_demand is not None:
            self.num_on_demand = decision.num_on_demand
        chosen = decision.configuration
        used = (
            decision.num_instances_used
            if decision.num_instances_used is not None
            else chosen.num_instances
            if chosen is not None
            else 0
        )
        if chosen is not None:
            if used > num_available + self.num_on_demand:
                raise InvariantError(
                    f"configuration {chosen} uses {used} instances; only "
                    f"{num_available} spot + {self.num_on_demand} on-demand are available"
                )
            if (
                chosen.data_parallel >= self.grid.shape[0]
                or chosen.pipeline_stages >= self.grid.shape[1]
                or self.grid[chosen.data_parallel, chosen.pipeline_stages] <= 0
            ):
                raise InvariantError(f"configuration {chosen} is not feasible for this model")
        self.reconfigurations += int(chosen != self.current or decision.downtime_s > 0)
        if chosen is None:
            self.moving_s = 0.0
        elif chosen != self.current or decision.downtime_s > 0:
            self.moving_s = decision.downtime_s
            if self.current is None and self.samples == 0:
                # Nothing trained yet, so there is no checkpoint: the first start loads none
                # (policies price every start from nothing as a restore). With gigabytes of
                # state behind a slow store, that load was most of a short run.
                self.moving_s = min(self.moving_s, self.costs.restart_s(used))
        self.moving_s += decision.checkpoint_s
        self.redo_s += decision.rollback_s
        self.current = chosen
        self.used = used
        self.factor = decision.throughput_factor

    def run(self, seconds: float) -> None:
        """Train for ``seconds`` of wall time, after the move and the re-done work."""
        if self.current is None:
            return
        moving = min(self.moving_s, seconds)
        redo = min(self.redo_s, seconds - moving)
        self.moving_s -= moving
        self.redo_s -= redo
        paid = moving + redo
        self.downtime_s += paid
        rate = self.grid[self.current.data_parallel, self.current.pipeline_stages] * self.factor
        gained = rate * (seconds - paid)
        if gained < 0:
            raise InvariantError("samples would decrease")
        self.samples += gained

    def run_until(self, seconds: float, target: float) -> float | None:
        """Train for ``seconds`` or until ``target`` samples; the seconds it took to reach the
        target (None: not reached; an infinite target is never reached)."""
        if self.current is None or seconds <= 0:
            return None
        moving = min(self.moving_s, seconds)
        redo = min(self.redo_s, seconds - moving)
        rate = self.grid[self.current.data_parallel, self.current.pipeline_stages] * self.factor
        need = target - self.samples
        if rate > 0 and rate * (seconds - moving - redo) >= need:
            done = moving + redo + max(need, 0.0) / rate
            self.run(done)
            self.samples = max(self.samples, target)
            return done
        self.run(seconds)
        return None

    def bill(self, spot_instance_s: float, seconds: float) -> None:
        """Pay ``spot_instance_s`` spot instance-seconds and ``seconds`` of the on-demand
        instances held now."""
        self.cost_usd += (
            spot_instance_s * self.spot_usd_per_s
            + self.num_on_demand * seconds * self.on_demand_usd_per_s
        )

    def measurements(
        self,
        configurations: list[tuple[int, int]],
        trained_s: dict[tuple[int, int], float],
        global_batch_size: int,
    ) -> tuple[Measurement, ...]:
        """The step time each configuration trains at, as the runtime measures it."""
        out = []
        for d, p in configurations:
            rate = float(self.grid[d, p])
            out.append(
                Measurement(
                    d,
                    p,
                    global_batch_size / rate,
                    max(1, int(trained_s[(d, p)] * rate / global_batch_size)),
                )
            )
        return tuple(out)

    def spot_in_use(self) -> int:
        return self.used - min(self.num_on_demand, self.used)
