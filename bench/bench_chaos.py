"""A fault campaign as a benchmark: ``python -m bench chaos [--faults N] [--seed S]
[--json FILE]``.

Real training (coordinator, agents on network-namespace hosts, TCP store and etcd) through
randomly drawn faults (:data:`liveput.testbed.faults.FAULT_KINDS`); after each run every step must
have been applied exactly once and the final parameters must equal a fault-free run's.

Targets: at least 200 faults in the default campaign, 0 lost or doubled steps, parameters equal,
the campaign done in under 20 minutes on this machine; downtime per fault kind (median, p95) is
printed. Needs root (network namespaces, a tmpfs), ``ip`` and ``etcd``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math

from liveput.testbed.campaign import CampaignConfig, RunOutcome, run_campaign
from liveput.testbed.faults import FAULT_KINDS

TARGET_WALL_S = 20 * 60.0
TARGET_FAULTS = 200


def _print_run(outcome: RunOutcome) -> None:
    kinds = ", ".join(kind for kind, _ in outcome.faults)
    status = "ok" if not outcome.error else f"FAILED: {outcome.error}"
    print(
        f"run {outcome.index:3d} ({outcome.store:4s}) {outcome.wall_s:5.1f} s, "
        f"{len(outcome.faults)} faults [{kinds}]"
        + (f", skipped [{', '.join(outcome.skipped)}]" if outcome.skipped else "")
        + f": lost {outcome.lost_steps}, doubled {outcome.doubled_steps}, params "
        f"{'equal' if outcome.params_equal else 'DIFFER'}; {status}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench chaos", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--faults", type=int, default=TARGET_FAULTS, help="faults to do (>= 1)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the campaign")
    parser.add_argument(
        "--lanes",
        type=int,
        default=CampaignConfig.lanes,
        help="runs done at once, each with its own hosts, tmpfs and etcd",
    )
    parser.add_argument("--json", metavar="FILE", help="write the summary here")
    parser.add_argument(
        "--kinds",
        default=",".join(FAULT_KINDS),
        help="comma-separated fault kinds to draw (default: all)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log each fault")
    args = parser.parse_args(argv or [])
    if args.faults < 1 or args.lanes < 1:
        parser.error("--faults and --lanes must be >= 1")
    kinds = tuple(k for k in args.kinds.split(",") if k)
    unknown = sorted(set(kinds) - set(FAULT_KINDS))
    if unknown or not kinds:
        parser.error(
            f"--kinds: unknown {', '.join(unknown) or 'none given'}; "
            f"known: {', '.join(FAULT_KINDS)}"
        )
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s: %(message)s",
    )
    print(
        f"fault campaign: {args.faults} faults, seed {args.seed}, {args.lanes} lane(s); kinds: "
        f"{', '.join(kinds)}",
        flush=True,
    )
    result = run_campaign(
        CampaignConfig(faults=args.faults, seed=args.seed, kinds=kinds, lanes=args.lanes),
        on_run=_print_run,
    )
    summary = result.summary()
    print("downtime per fault kind (fault -> next committed step):")
    for kind, figures in summary["downtime_s"].items():
        median = figures["median"] if figures["median"] is not None else math.nan
        p95 = figures["p95"] if figures["p95"] is not None else math.nan
        print(
            f"  {kind:20s} n={summary['by_kind'][kind]:3d}  median {median:6.2f} s  "
            f"p95 {p95:6.2f} s"
        )
    print(
        f"faults {summary['faults']} (target >= {TARGET_FAULTS}: "
        f"{summary['faults'] / TARGET_FAULTS:.2f}x); lost steps {summary['lost_steps']}, "
        f"doubled {summary['doubled_steps']} (target 0); parameters equal to the fault-free "
        f"run: {summary['params_equal']}; {summary['runs']} runs, "
        f"{len(summary['failed_runs'])} failed; {sum(summary['skipped'].values())} faults "
        "skipped (their runs ended first) and dealt again",
        flush=True,
    )
    print(
        f"wall {result.wall_s:.0f} s (target < {TARGET_WALL_S:.0f} s: "
        f"{result.wall_s / TARGET_WALL_S:.2f}x)",
        flush=True,
    )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(summary, handle, indent=2)
