"""Every command against the hostile-input corpus (``bench/hostile.py``).

Prints the count of each verdict over the corpus (target: every case ``ok``: no traceback, no
hang, no bad input accepted, no partial output, no refusal above 500 MB), the largest memory
of a refusal, and each case that fell short. ``LIVEPUT_BENCH_JSON=FILE`` also writes the
summary as JSON.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from bench.hostile import REFUSAL_MEMORY_MB, corpus, run_case, summary, to_json


def main() -> None:
    cases = corpus()
    workers = max(1, min(4, os.cpu_count() or 1))
    print(f"hostile input: {len(cases)} cases, {workers} at a time", flush=True)
    outcomes = []
    with ThreadPoolExecutor(workers) as pool:
        for index, outcome in enumerate(pool.map(run_case, cases), start=1):
            outcomes.append(outcome)
            if outcome.verdict != "ok":
                print(
                    f"  {outcome.verdict:9s} {outcome.case.name}: "
                    f"{outcome.stderr.strip().splitlines()[-1:] or ''} {outcome.left or ''}",
                    flush=True,
                )
            if index % 50 == 0:
                print(f"  ... {index}/{len(cases)}", flush=True)
    figures = summary(outcomes)
    print(f"verdicts: {figures['verdicts']}")
    bad = sum(n for verdict, n in figures["verdicts"].items() if verdict != "ok")
    print(f"cases not ok: {bad} of {len(cases)} (target 0)")
    print(
        f"largest refusal: {figures['largest_refusal_mb']:.0f} MB "
        f"(target <= {REFUSAL_MEMORY_MB:.0f}); slowest case {figures['slowest_s']:.1f} s"
    )
    path = os.environ.get("LIVEPUT_BENCH_JSON")
    if path:
        with open(path, "w", encoding="utf-8") as out:
            out.write(to_json(outcomes) + "\n")


if __name__ == "__main__":
    main()
