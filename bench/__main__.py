"""Run every benchmark module (``bench/bench_*.py``, each with a ``main()``) or the ones named.

Usage: ``python -m bench [NAME ...]`` where NAME is e.g. ``forecast`` for ``bench_forecast.py``.
Each benchmark prints its figures and the ratio to its target.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    here = Path(__file__).parent
    names = argv or sorted(p.stem.removeprefix("bench_") for p in here.glob("bench_*.py"))
    for name in names:
        print(f"== bench {name}", flush=True)
        importlib.import_module(f"bench.bench_{name}").main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
