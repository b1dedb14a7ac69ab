"""Import what the suite imports, so that Python writes its bytecode once, before the tests run.

``make test`` runs this before the tests, in two processes (a core each), while nothing else runs.
A fresh ``make setup`` installs without bytecode (uv compiles none: compiling every module of
every package, torch's thousands among them, took most of a setup); without this, both
unit-tier workers compiled the same modules as they first imported them (the unit tier took
67.5 s on a fresh clone, 55.5 s once the bytecode was there). Every liveput module, and what they
import only inside functions: the agents' (``torch._dynamo`` builds their optimizers), the
peers', the clouds' and the browser's.
"""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

import liveput

TORCH_SIDE = (
    "torch._dynamo",
    "torch.distributed.checkpoint",
    "torch.distributed.fsdp",
    "transformers",
)
"""Imported after liveput's modules, in this process (they import torch, as liveput's do)."""
OTHER_SIDE = (
    "statsmodels.api",
    "scipy.optimize",
    "scipy.stats",
    "matplotlib.pyplot",
    "boto3",
    "moto",
    "selenium.webdriver",
    "hypothesis.strategies",
    "xdist",
)
"""Imported by a second process meanwhile, on the other core: nothing of torch (on a fresh
clone the torch side took 9.4 CPU-s, this one 6.8)."""


def main(argv: list[str]) -> int:
    if argv == ["--other-side"]:
        for name in OTHER_SIDE:
            importlib.import_module(name)
        return 0
    other = subprocess.Popen([sys.executable, __file__, "--other-side"])
    for module in pkgutil.walk_packages(liveput.__path__, "liveput."):
        importlib.import_module(module.name)
    for name in TORCH_SIDE:
        importlib.import_module(name)
    return other.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
