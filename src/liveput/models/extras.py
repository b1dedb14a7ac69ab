"""Optional dependencies of the model adapters (the ``models`` extra).

``transformers`` and ``pyarrow`` are only needed for the models and datasets that use them; a
missing one is one line naming the extra to install, not an ImportError deep in a stack.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from liveput.errors import LiveputError

INSTALL_HINT = "pip install 'liveput[models]'"
"""How to get every optional dependency of the adapters."""


def require(module: str, needed_for: str) -> ModuleType:
    """Import ``module`` or raise a one-line :class:`LiveputError` naming the extra."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise LiveputError(
            f"{needed_for} needs the Python package {module.split('.')[0]!r}: {INSTALL_HINT}"
        ) from None
