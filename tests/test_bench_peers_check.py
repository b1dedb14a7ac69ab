"""peers-check's verdict on one run: a step before the kill, and steps past where the job was
after it; a step in flight at the kill is not a restart."""

from __future__ import annotations

from bench.bench_peers_check import check
from bench.peers_run import SystemRun


def _run(points: list[tuple[float, int]]) -> SystemRun:
    return SystemRun("torchrun-pp", points[-1][1], [(0.0, 0), *points], [120.0])


def test_a_restart_from_zero_trains_again_once_past_where_it_was() -> None:
    # Steps every 17 s; the kill at 120 s; the step in flight lands at 123 s; the restart
    # redoes steps 0-2 and passes 48 samples at 232 s.
    run = _run([(88.0, 16), (104.0, 32), (123.0, 48), (195.0, 16), (213.0, 32), (232.0, 48),
                (252.0, 64)])  # fmt: skip
    passed, what = check(run, 120.0)
    assert passed and "past them again 132.0 s after it (1 steps after)" in what


def test_no_step_past_the_kill_or_before_it_fails() -> None:
    stuck = _run([(88.0, 16), (104.0, 32), (123.0, 48), (195.0, 16)])
    assert check(stuck, 120.0) == (False, "2 steps, none past them after the kill at 120 s")
    late = _run([(150.0, 16)])
    assert check(late, 120.0) == (False, "no step before the kill at 120 s")
    assert check("RuntimeError: boom", 120.0) == (False, "could not run: RuntimeError: boom")
