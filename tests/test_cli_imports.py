"""The CLI starts fast: importing it pulls in none of the heavy libraries (matplotlib, scipy,
torch, pandas, transformers); the commands that need one import it when they run.

Two checks: a static one in the unit tier (the graph of module-level imports from
``liveput.cli.main``, read from the sources), and the real one in the ``process`` tier (a fresh
interpreter imports the CLI and lists the heavy packages in ``sys.modules``).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import liveput

HEAVY = ("matplotlib", "scipy", "torch", "pandas", "transformers")
"""Packages that cost from a tenth of a second to seconds to import."""

PACKAGE_ROOT = Path(liveput.__file__).resolve().parent


def _source(module: str) -> Path | None:
    """The file of a ``liveput`` module, or None for any other (a third-party leaf)."""
    parts = module.split(".")
    if parts[0] != "liveput":
        return None
    base = PACKAGE_ROOT.joinpath(*parts[1:])
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_time_nodes(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    """The import statements that run when a module is imported: at module level, in class
    bodies and in module-level ``if``/``try``/``with`` blocks; not in functions, nor under
    ``if TYPE_CHECKING``."""
    found: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                found += _import_time_nodes(node.body)
            found += _import_time_nodes(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                found += _import_time_nodes(block)
            for handler in node.handlers:
                found += _import_time_nodes(handler.body)
        elif isinstance(node, ast.With | ast.ClassDef):
            found += _import_time_nodes(node.body)
    return found


def _with_parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _imported_by(module: str, path: Path) -> list[str]:
    """The modules (with their parent packages) that importing ``module`` imports directly."""
    names: list[str] = []
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in _import_time_nodes(ast.parse(path.read_text(), str(path)).body):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names += _with_parents(alias.name)
            continue
        if node.level:
            anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
            target = ".".join(anchor + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        if target == "__future__":
            continue
        names += _with_parents(target)
        # `from package import name` imports the submodule package.name when there is one.
        submodules = (f"{target}.{alias.name}" for alias in node.names)
        names += [name for name in submodules if _source(name)]
    return names


def import_chains(start: str) -> dict[str, list[str]]:
    """Every module reached from ``start`` by module-level imports, with the chain of imports
    that first reaches it (breadth first, so the chain is a shortest one)."""
    chains = {name: _with_parents(start)[: i + 1] for i, name in enumerate(_with_parents(start))}
    queue = list(chains)
    while queue:
        module = queue.pop(0)
        path = _source(module)
        if path is None:
            continue
        for name in _imported_by(module, path):
            if name not in chains:
                chains[name] = [*chains[module], name]
                queue.append(name)
    return chains


def test_cli_imports_no_heavy_package_at_start() -> None:
    chains = import_chains("liveput.cli.main")
    assert "liveput.cli.trace" in chains  # the walk follows the CLI's own modules
    heavy = {name: " -> ".join(chain) for name, chain in chains.items() if name in HEAVY}
    assert not heavy, f"liveput.cli.main imports at start-up: {heavy}"


def test_a_job_starts_without_scipy() -> None:
    """The coordinator and `liveput train`'s assembly need torch, not scipy: the online re-fit
    imports scipy.optimize when it fits (about 0.3 CPU-s a process otherwise)."""
    chains = import_chains("liveput.launch.local")
    assert "liveput.perf.calibrate" in chains  # the walk reaches the fit's module
    scipy = {name: " -> ".join(chain) for name, chain in chains.items() if name == "scipy"}
    assert not scipy, f"liveput.launch.local imports at start-up: {scipy}"


def test_import_walk_sees_module_level_imports_only(tmp_path: Path) -> None:
    tree = ast.parse(
        "import numpy\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import torch\n"
        "try:\n    import scipy\nexcept ImportError:\n    import pandas\n"
        "class A:\n    import matplotlib\n"
        "def f():\n    import transformers\n"
    )
    found = {alias.name for node in _import_time_nodes(tree.body) for alias in node.names}
    assert found == {"numpy", "TYPE_CHECKING", "scipy", "pandas", "matplotlib"}


@pytest.mark.process
def test_cli_import_in_a_fresh_interpreter_loads_no_heavy_package() -> None:
    listing = (
        f"import sys, liveput.cli.main\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", listing], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.split() == []
