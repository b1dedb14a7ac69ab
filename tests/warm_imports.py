"""Import what the suite imports, so that Python writes its bytecode once, before the tests run.

A fresh ``make setup`` installs without bytecode (``--no-compile``: pip would compile every
module of every package); without this, the suite's workers compiled the same modules as they
first imported them (the unit tier took 67.5 s on a fresh clone, 55.5 s once the bytecode was
there). Every liveput module, and what they import only inside functions: the agents'
(``torch._dynamo`` builds their optimizers), the peers', the clouds' and the browser's.

``make test`` runs the two parts at once, one a core: ``torch`` (torch and what is built on it)
and ``rest`` (the other packages first, then liveput, whose torch the first part has compiled
meanwhile). Each took 7.5-8 s alone on a fresh clone, the whole 15 s.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import liveput

PARTS = {
    "torch": (
        "torch",
        "torch._dynamo",
        "torch.distributed.checkpoint",
        "torch.distributed.fsdp",
        "transformers",
    ),
    "rest": (
        "boto3",
        "moto",
        "selenium.webdriver",
        "statsmodels.api",
        "scipy.optimize",
        "scipy.stats",
        "matplotlib.pyplot",
        "hypothesis.strategies",
        "xdist",
    ),
}


def main(part: str) -> None:
    for name in PARTS[part]:
        importlib.import_module(name)
    if part == "rest":
        for module in pkgutil.walk_packages(liveput.__path__, "liveput."):
            importlib.import_module(module.name)


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in PARTS:
        sys.exit(f"usage: python tests/warm_imports.py {'|'.join(PARTS)}")
    main(sys.argv[1])
