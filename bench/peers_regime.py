"""The two regimes ``bench peers`` compares the systems in.

- ``data-parallel`` (the default): ``tiny-gpt``, a model that fits one instance, its state a few
  MB; every instance on this machine's loopback. Data parallelism alone is the best
  configuration there, and per-step healing (torchft) is as good as anything.
- ``pipeline``: the same model under a per-instance memory budget that no instance fits alone
  (liveput plans pipelines of 4 stages; the sharded peers shard over enough instances), each
  instance on a host of its own whose link is shaped so that moving one stage's state takes
  about a step's time, as moving a GPT-1.5B stage over a spot V100's 10 Gb/s does next to its
  step (``docs/peers.md``, "The pipeline regime", derives the rate).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

BYTES_PER_PARAMETER = 16
"""fp32 weights, gradients and Adam's two moments."""


@dataclass(frozen=True)
class Regime:
    """What one regime fixes for every system it runs."""

    name: str
    """``data-parallel`` or ``pipeline`` (``--regime``)."""
    job: str
    """Built-in liveput job every system trains."""
    systems: tuple[str, ...]
    """Systems run when ``--systems`` names none."""
    instance_memory_gb: float | None = None
    """Each instance's memory budget, GB (None: the machine's)."""
    link_mbit: float | None = None
    """Each instance's link, Mbit/s each way (None: loopback, not shaped)."""
    object_store: bool = False
    """Checkpoints in an S3 bucket behind the shaped links (:mod:`bench.peers_storage`), as a
    cloud's object store sits behind an instance's network card; False: a local folder."""
    workers: int = 4
    """Instances requested: every trace is cut or generated for this many (the two cores of this
    machine run them; one thread each)."""
    seeds: tuple[int, ...] = (20,)
    """Seeds of the generated traces (the full benchmark runs them and the p3 cut; ``--quick``
    the first)."""
    steady_instances: int = 2
    """Instances of the no-preemption runs."""
    fewest_instances: int = 1
    """Fewest instances a configuration of the job fits on (tiny-gpt at 0.035 GB: 1x4); the
    throughput table starts there."""
    time_scale: float = 3.0
    """Trace seconds per wall second (the full benchmark). tiny-gpt's 3: 100-s windows, 50 steps
    or more for every system (torchrun starts in 20-25 s and takes about 4 steps a second here),
    and two traces x five systems x three runs in under an hour."""
    quick_time_scale: float = 4.0
    """Trace seconds per wall second (``--quick``)."""
    steady_window_s: float = 60.0
    """Wall seconds of each no-preemption run (the full benchmark). A system's own rate (its
    ``no-preempt/s``, its checkpoint interval) is measured from the run's first step to its
    last, start-up left out; liveput's run also gives the rate of ``steady_instances`` to the
    bound and the simulator, past its warm-up as every count's (:mod:`bench.peers_rates`)."""
    quick_steady_window_s: float = 45.0
    """The same with ``--quick``."""
    count_window_s: float = 30.0
    """Wall seconds of each run per instance count (the simulator's throughput table and the
    bound's), its rate taken past its warm-up (:mod:`bench.peers_rates`), as the longer
    no-preemption run's is: the same rule makes the counts comparable without making each
    count run as long as that run (two more minutes a regime)."""
    quick_counts: tuple[int, ...] | None = None
    """Instance counts ``--quick`` measures (the others interpolated); None: every count."""
    notice_margin_s: float | None = 5.0
    """liveput's ``--notice-margin``, wall seconds: what a user who measured the move off a
    noticed instance would set. tiny-gpt's layers move in 0.2 s here (``bench chaos``: 0.06 s
    median, 2.5 s p95 of downtime for a noticed kill on the loaded machine). None: ``auto``,
    the product's default (twice the move the run measured)."""
    checkpoint_every_s: float = 2.0
    """Wall seconds between checkpoints, the same for every system (``--checkpoint-every-s``):
    each system checkpoints every ``round(checkpoint_every_s / its step time)`` steps, at least
    1, its step time measured without preemption. tiny-gpt's 2 s: about the 10 steps of
    liveput's and torchrun's step here, the interval every system had by steps before."""
    targets: tuple[tuple[str, float], ...] = (("torchrun", 1.5), ("torchft", 1.0))
    """(peer, least ratio of liveput's samples to the peer's) the verdicts check without a
    notice."""
    notice_targets: tuple[tuple[str, float], ...] | None = None
    """The same with a notice (None: ``targets``)."""


DATA_PARALLEL = Regime(
    "data-parallel",
    "tiny-gpt",
    ("liveput", "liveput-restart", "torchrun", "torchrun-notice", "torchft"),
    # Without a notice: >= torchft, >= 1.5x torchrun; with one, >= 1.2x torchft and >= 2x
    # torchrun checkpointing on it.
    targets=(("torchrun", 1.5), ("torchft", 1.0)),
    notice_targets=(("torchft", 1.2), ("torchrun-notice", 2.0), ("torchrun", 1.5)),
)
PIPELINE = Regime(
    "pipeline",
    "tiny-gpt",
    # liveput-restart, the reactive policy on liveput's runtime, is an ablation, not a peer:
    # run it with --systems (six systems of three runs on two traces take over an hour).
    ("liveput", "torchrun-pp", "torchrun-pp-notice", "torchrun-fsdp", "torchft-hsdp"),
    # The data-parallel regime's model on instances too small for it: its fp32 weights,
    # gradients and Adam state (53 MB) and a micro-batch's activations fit no fewer than four
    # stages (liveput's plan: 1x4 on 4 to 7 instances, 2x4 on 8); the sharded peers shard it
    # over 2.
    instance_memory_gb=0.035,
    # A stage's weights and Adam state (10 MB) cross the link in about 0.4 s, a step or so, as
    # a GPT-1.5B stage (2.25 GB at (4, 8)) crosses p3.2xlarge's 10 Gb/s in 2.7 s next to its
    # 2.9-s step (docs/peers.md, "The pipeline regime"); a sharded step moves about 3 x 13 MB
    # each way per instance (1.4 s).
    link_mbit=200.0,
    object_store=True,
    # Eight, so that the traces keep the four a pipeline needs most of the time.
    workers=8,
    seeds=(20,),
    steady_instances=8,
    fewest_instances=4,
    time_scale=3.0,
    quick_time_scale=5.0,
    count_window_s=30.0,
    quick_counts=(4, 8),
    # The product's default, auto: twice the move the run measured (0.85-0.89 s per move of a
    # stage here), where a fixed 5 s gave up 4 s of every noticed instance's lead.
    notice_margin_s=None,
    # Every 25 or so of liveput's steps; a stage's part of a checkpoint crosses its link in
    # under half a second.
    checkpoint_every_s=10.0,
    # The targets the pipeline work set: >= 1.5x torchrun-pp, >= 1.2x torchrun-pp-notice and
    # every other peer.
    targets=(
        ("torchrun-pp", 1.5),
        ("torchrun-pp-notice", 1.2),
        ("torchrun-fsdp", 1.2),
        ("torchft-hsdp", 1.2),
    ),
)
REGIMES = {regime.name: regime for regime in (DATA_PARALLEL, PIPELINE)}


def sharded_minimum(parameters: int, instance_memory_gb: float | None) -> int:
    """The fewest instances over which a fully sharded job of ``parameters`` fits
    ``instance_memory_gb`` each: its weights, gradients and optimizer state split evenly, the
    gathered layer and the activations not counted (in the sharded peer's favour)."""
    if instance_memory_gb is None:
        return 1
    return max(1, math.ceil(parameters * BYTES_PER_PARAMETER / (instance_memory_gb * 1e9)))


def interpolated(rates: dict[int, float], counts: range) -> dict[int, float]:
    """``rates`` measured at some instance counts, the others of ``counts`` between two measured
    ones linearly interpolated (outside them: left out)."""
    measured = sorted(rates)
    out = {}
    for count in counts:
        if count in rates:
            out[count] = rates[count]
            continue
        below = [n for n in measured if n < count]
        above = [n for n in measured if n > count]
        if below and above:
            low, high = below[-1], above[0]
            share = (count - low) / (high - low)
            out[count] = rates[low] + share * (rates[high] - rates[low])
    return out
