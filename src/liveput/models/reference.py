"""A user's model reference, ``module:function``, found the same way by every command.

The grammar is ``[FOLDER/]module[.py]:function``: ``mymodel:target`` and ``mypkg.model:target``
are looked up in the current folder first, then among the installed packages (and
``PYTHONPATH``); ``path/to/mymodel.py:target`` or ``/abs/folder/mymodel:target`` name the folder
that holds the module, and only that folder is searched. A job file's ``model:`` is also looked up
in the job file's folder (:func:`locate_reference` rewrites it to the folder form, so that the
agents, which read the reference from the published job spec, find the module wherever they run).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import inspect
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from liveput.errors import LiveputError


@dataclass(frozen=True)
class ModelReference:
    """A parsed ``[FOLDER/]module:function``."""

    module: str
    """The dotted module name (``mypkg.model``)."""
    function: str
    """The function in it that returns the model."""
    folder: str | None = None
    """The folder holding the module's top package (None: the current folder, then the
    installed packages)."""

    @property
    def top(self) -> str:
        """The top-level package or module name, the one looked up in folders."""
        return self.module.split(".", 1)[0]

    def text(self) -> str:
        """The reference as the user would write it."""
        prefix = "" if self.folder is None else f"{self.folder.rstrip('/')}/"
        return f"{prefix}{self.module}:{self.function}"


def is_reference(spec: str) -> bool:
    """Whether ``spec`` has the form of a model reference (not a built-in name, not a profile)."""
    return ":" in spec and not spec.endswith(".json")


def parse_reference(spec: str) -> ModelReference:
    """``spec`` parsed; a one-line LiveputError for a malformed one."""
    left, _, function = spec.rpartition(":")
    folder: str | None = None
    if "/" in left:
        folder, _, left = left.rpartition("/")
        folder = folder or "/"
    module = left.removesuffix(".py")
    parts = module.split(".")
    if not function.isidentifier() or not all(part.isidentifier() for part in parts):
        raise LiveputError(
            f"model reference {spec!r}: expected [FOLDER/]module:function "
            "(e.g. mymodel:target or mypkg.model:target)"
        )
    return ModelReference(module, function, folder)


def _module_in(top: str, folder: Path) -> bool:
    return importlib.machinery.PathFinder.find_spec(top, [str(folder)]) is not None


def _folders(reference: ModelReference, extra: Sequence[str | Path]) -> list[Path]:
    """The folders searched for ``reference``, in order."""
    if reference.folder is not None:
        return [Path(reference.folder).resolve()]
    found: list[Path] = []
    for folder in [Path.cwd(), *(Path(f).resolve() for f in extra)]:
        if folder not in found:
            found.append(folder)
    return found


def _find_folder(reference: ModelReference, extra: Sequence[str | Path]) -> Path | None:
    """The folder to import ``reference`` from (None: importable as installed); a one-line
    LiveputError naming the folders looked in when it is nowhere."""
    folders = _folders(reference, extra)
    for folder in folders:
        if _module_in(reference.top, folder):
            return folder
    if reference.folder is None and (
        reference.top in sys.modules or importlib.util.find_spec(reference.top) is not None
    ):
        return None
    places = ", ".join(
        str(folder) + ("" if folder.is_dir() else " (no such folder)") for folder in folders
    )
    if reference.folder is not None:
        raise LiveputError(f"model {reference.text()}: no module {reference.top!r} in {places}")
    raise LiveputError(
        f"model {reference.text()}: no module {reference.top!r} in {places} or the installed "
        "packages; run from the module's folder or write FOLDER/module:function"
    )


def load_reference(
    spec: str, expected: tuple[type, ...], kind: str, extra_folders: Sequence[str | Path] = ()
) -> Any:
    """Import the user's module and call its function; the result must be one of ``expected``.

    The module's folder goes first on ``sys.path`` (as ``python -m`` puts the current folder), so
    that the user's module imports its sibling modules as it would when run there."""
    reference = parse_reference(spec)
    folder = _find_folder(reference, extra_folders)
    if folder is not None and str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    try:
        module = importlib.import_module(reference.module)
    except ImportError as error:
        raise LiveputError(f"cannot load {kind} {spec}: {error}") from None
    except SyntaxError as error:
        raise LiveputError(
            f"cannot load {kind} {spec}: {error.filename}:{error.lineno}: {error.msg}"
        ) from None
    function = getattr(module, reference.function, None)
    if not callable(function):
        raise LiveputError(
            f"cannot load {kind} {spec}: module {reference.module!r} "
            f"({getattr(module, '__file__', '?')}) has no function {reference.function!r}"
        )
    try:
        inspect.signature(function).bind()
    except TypeError:
        raise LiveputError(
            f"cannot load {kind} {spec}: {reference.function}{inspect.signature(function)} "
            "must be callable without arguments"
        ) from None
    except ValueError:  # no signature to read (a builtin): let the call say
        pass
    made = function()
    if not isinstance(made, expected):
        names = " or ".join(f"{t.__module__}.{t.__qualname__}" for t in expected)
        raise LiveputError(f"{spec} must return a {names}, not {type(made).__name__}")
    return made


def locate_reference(spec: str, extra_folders: Iterable[str | Path]) -> str:
    """``spec`` in the folder form (the absolute folder its module is found in: the current
    folder, else one of ``extra_folders``, a job file's), so that the agents and a later
    ``resume`` from another folder find it again; unchanged when it names its folder or its
    module is installed. A one-line LiveputError naming the folders looked in when the module
    is nowhere."""
    reference = parse_reference(spec)
    folder = _find_folder(reference, list(extra_folders))
    if reference.folder is not None or folder is None:
        return spec
    return ModelReference(reference.module, reference.function, str(folder)).text()
