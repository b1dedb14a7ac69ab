"""Run every benchmark module (``bench/bench_*.py``, each with a ``main()``) or the ones named.

Usage: ``python -m bench [NAME ...]`` where NAME is e.g. ``forecast`` for ``bench_forecast.py``
(``calibrate-online`` for ``bench_calibrate_online.py``);
``python -m bench NAME --option ...`` passes the options to that one benchmark's
``main(argv)`` (e.g. ``python -m bench chaos --faults 200 --seed 1 --json out.json``).
Each benchmark prints its figures and the ratio to its target.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    here = Path(__file__).parent
    split = next((i for i, arg in enumerate(argv) if arg.startswith("-")), len(argv))
    names, options = argv[:split], argv[split:]
    if options and len(names) != 1:
        print(
            "python -m bench: options go to one benchmark: python -m bench NAME --option ...",
            file=sys.stderr,
        )
        return 2
    names = names or sorted(p.stem.removeprefix("bench_") for p in here.glob("bench_*.py"))
    for name in names:
        print(f"== bench {name}", flush=True)
        module = importlib.import_module(f"bench.bench_{name.replace('-', '_')}")
        if options and not inspect.signature(module.main).parameters:
            print(f"python -m bench {name} takes no options (given: {' '.join(options)})")
            return 2
        if options:
            module.main(options)
        else:
            module.main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
