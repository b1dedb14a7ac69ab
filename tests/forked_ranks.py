"""Ranks forked from the test process (torch already imported: a spawned rank imports it again,
seconds each on the loaded machine), made safe to fork.

A pytest worker that ran an earlier test's process group may still hold that group as garbage
in a reference cycle. A forked rank inherits it, and when the rank's garbage collector frees it
(here in the middle of a DCP save's unpickling), ``ProcessGroupGloo``'s destructor waits on a
condition variable of the parent's threads, which the child does not have: the rank hung for
good (seen once in `make test`, py-spy: ``~ProcessGroupGloo`` in ``pthread_cond_broadcast``
under ``gc_collect_main``). So the parent collects its garbage before it forks, and each rank
freezes what it inherited (``gc.freeze``: never collected in the child)."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

from torch.multiprocessing.spawn import start_processes


def fork_ranks(target: Callable[..., None], args: tuple[Any, ...], nprocs: int) -> None:
    """Run ``target(rank, *args)`` in ``nprocs`` forked processes and wait for them; a rank's
    failure raises here with its traceback."""
    gc.collect()
    start_processes(_frozen, args=(target, *args), nprocs=nprocs, start_method="fork")


def _frozen(rank: int, target: Callable[..., None], *args: Any) -> None:
    gc.freeze()
    target(rank, *args)
