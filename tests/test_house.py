"""The house's measurable rules: files and functions of src/ kept short, each public class
name defined once, no unresolvable issue numbers in the code, and no import cycle between the
modules of src/liveput (import-linter guards the floors between packages; this guards the modules
inside them, imports inside functions counted)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "liveput"
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 100


def _sources(*folders: Path) -> list[Path]:
    """The Python files of ``folders``, not those under a hidden folder: ``bench peers`` keeps
    a virtual environment in ``bench/.peers-venv`` (pip's own sources), and once it had run,
    this suite read them as the repository's."""
    return sorted(
        p
        for folder in folders
        for p in folder.rglob("*.py")
        if not any(part.startswith(".") for part in p.relative_to(folder).parts)
    )


def test_no_file_in_src_is_over_500_lines_and_no_function_over_100() -> None:
    long_files, long_functions = [], []
    for path in _sources(SRC):
        text = path.read_text()
        name = path.relative_to(ROOT)
        if text.count("\n") > MAX_FILE_LINES:
            long_files.append(f"{name} ({text.count(chr(10))} lines)")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long_functions.append(f"{name}:{node.lineno} {node.name} ({length} lines)")
    assert not long_files and not long_functions, (long_files, long_functions)


def test_each_public_class_name_is_defined_once_in_src() -> None:
    defined: dict[str, list[str]] = {}
    for path in _sources(SRC):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                defined.setdefault(node.name, []).append(str(path.relative_to(ROOT)))
    twice = {name: places for name, places in defined.items() if len(places) > 1}
    assert not twice, twice


def test_no_issue_numbers_in_src_tests_or_bench() -> None:
    pattern = re.compile(r"\b[Ii]ssue[s]? #?\d+\b")
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in _sources(SRC, ROOT / "tests", ROOT / "bench")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not found, found


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The liveput modules ``path`` imports, anywhere in it (a package import counts as its
    ``__init__``; ``from package import module`` as the module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def test_the_modules_of_src_import_each_other_without_a_cycle() -> None:
    paths = {_module_name(p): p for p in _sources(SRC)}
    known = set(paths)
    graph = {name: _imports(path, name, known) for name, path in paths.items()}
    # A package's __init__ re-exporting its modules is not a cycle with them.
    for name in graph:
        graph[name] = {t for t in graph[name] if not name.startswith(t + ".")}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                cycles.append([*stack[stack.index(target) :], target])
            elif target not in state:
                visit(target, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    assert not cycles, cycles[:5]
