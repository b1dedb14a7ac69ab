"""The notice margin in force: how long before a noticed instance's announced end the job moves
off it (:mod:`liveput.runtime.decide`'s *going*).

A fixed ``notice_margin_s``, or with ``--notice-margin auto`` (None, the default)

    margin_s = max(notice_margin_min_s, notice_margin_safety * move_s)

where ``move_s`` is the newest move between instances this run measured (from the plan's
publication to its first committed step: the fence, the group rebuild, the layers over the
link and a step), and until one is, the move predicted for the running plan (a group rebuild
and its largest stage's state at the links' rate, :class:`liveput.perf.costs.MigrationCostModel`).
The executor (the coordinator's observer) computes the auto margin into the view; the decision
reads the one in force from here.
"""

from __future__ import annotations

from liveput.runtime.coordinator_config import CoordinatorConfig
from liveput.runtime.coordinator_view import CoordinatorView


def notice_margin_s(view: CoordinatorView, config: CoordinatorConfig) -> float:
    """The notice margin in force, wall seconds: ``config.notice_margin_s``, or where that is
    None (``--notice-margin auto``) the view's, which the executor derives from the moves it
    measured (:attr:`CoordinatorView.auto_notice_margin_s`)."""
    return margin_in_force(config, view.auto_notice_margin_s)


def margin_in_force(config: CoordinatorConfig, auto_s: float) -> float:
    """``config.notice_margin_s``, or ``auto_s`` where it is None (``auto``)."""
    return auto_s if config.notice_margin_s is None else config.notice_margin_s


def auto_notice_margin_s(
    config: CoordinatorConfig, measured_move_s: float | None, predicted_move_s: float
) -> float:
    """``--notice-margin auto``: ``notice_margin_safety`` x the move's seconds (the newest
    measured, else the predicted), at least ``notice_margin_min_s``."""
    move_s = predicted_move_s if measured_move_s is None else measured_move_s
    return max(config.notice_margin_min_s, config.notice_margin_safety * move_s)
