"""Import what the suite imports, so that Python writes its bytecode once, before the tests run.

``make test`` runs this beside the linters (the type checker's two processes), before the tests.
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

import liveput

LAZY = (
    "torch._dynamo",
    "torch.distributed.checkpoint",
    "torch.distributed.fsdp",
    "transformers",
    "boto3",
    "moto",
    "selenium.webdriver",
    "statsmodels.api",
    "scipy.optimize",
    "scipy.stats",
    "matplotlib.pyplot",
    "hypothesis.strategies",
    "xdist",
)


def main() -> None:
    for module in pkgutil.walk_packages(liveput.__path__, "liveput."):
        importlib.import_module(module.name)
    for name in LAZY:
        importlib.import_module(name)


if __name__ == "__main__":
    main()
