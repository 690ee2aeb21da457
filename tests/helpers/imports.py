"""What a source file imports from a package, read with `ast` (the import-boundary tests)."""

from __future__ import annotations

import ast
import tomllib
from collections import deque
from collections.abc import Mapping
from pathlib import Path


def imports_from(path: Path, package: str) -> list[tuple[str, str]]:
    """(module, name) of every `from package... import name`, `import package...` and `from parent import leaf`
    (package = parent.leaf) in a file; name is "" for a plain import."""
    parent, _, leaf = package.rpartition(".")
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(package):
            found += [(node.module or "", alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and parent and node.module == parent:
            found += [(package, "") for alias in node.names if alias.name == leaf]
        elif isinstance(node, ast.Import):
            found += [(alias.name, "") for alias in node.names if alias.name.startswith(package)]
    return found


# --- the import graph of the `infer` import root (the no-circles guard)


def infer_modules(root: Path) -> dict[str, Path]:
    """Every module of the `infer` import root, by dotted name (a package by its own name, for its
    `__init__.py`): the folders pyproject.toml maps onto `infer.*` (package-dir), read from there."""
    package_dir = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    modules = {}
    for package, folder in package_dir.items():
        for path in (root / folder).rglob("*.py"):
            parts = path.relative_to(root / folder).with_suffix("").parts
            if "node_modules" in parts or any(part.startswith(".") for part in parts):
                continue
            modules[".".join((package, *parts[: -1 if parts[-1] == "__init__" else None]))] = path
    return modules


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The module an ImportFrom names, a relative one (`from . import x`) resolved against `module`."""
    if not node.level:
        return node.module or ""
    parts = module.split(".") if is_package else module.split(".")[:-1]
    base = parts[: len(parts) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def module_imports(module: str, path: Path, modules: Mapping[str, Path]) -> dict[str, int]:
    """The modules of `modules` that `module` imports, each with the line of its first import.

    Every import statement counts, wherever it is: at the top, under `if TYPE_CHECKING:` (the names a module's
    types use are part of what it depends on: mypy and a reader follow them) and inside a function (a deferred
    import still needs the other module: it only moves the circle's failure to run time).
    `from P import name` is an edge to `P.name` when that is a module, else to `P` (whose `__init__` holds
    the name). The package `__init__`s Python runs on the way to a module are not edges: only what a file names.
    So an `__init__` that gathers its modules' names makes no circle, but a module that takes a name from its own
    package's `__init__` does (the `__init__` imports it back)."""
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, module, path.name == "__init__.py")
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        for target in targets:
            if target in modules and target != module:
                found[target] = min(found.get(target, node.lineno), node.lineno)
    return found


def import_graph(modules: Mapping[str, Path]) -> dict[str, dict[str, int]]:
    """module -> {module it imports: the line}, for every module of `modules` (`module_imports`)."""
    return {module: module_imports(module, path, modules) for module, path in modules.items()}


def reaches(graph: Mapping[str, Mapping[str, int]], start: str, goal: str) -> list[str] | None:
    """The shortest import path start -> ... -> goal (both ends included), or None when there is none."""
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        current = queue.popleft()
        for nxt in sorted(graph.get(current, {})):
            if nxt == goal:
                path = [goal, current]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return path[::-1]
            if nxt not in came_from and nxt != start:
                came_from[nxt] = current
                queue.append(nxt)
    return None


def circle_group(graph: Mapping[str, Mapping[str, int]], module: str) -> set[str]:
    """The modules on some circle through `module` (each reaches it and is reached from it); empty when none."""
    return {m for m in graph if reaches(graph, module, m) and reaches(graph, m, module)}


def circles(graph: Mapping[str, Mapping[str, int]]) -> list[list[str]]:
    """One circle (a, b, ..., a: each imports the next) for each group of modules that import one another: the
    shortest through the group's first module by name. Empty when the imports point one way only."""
    found, seen = [], set[str]()
    for module in sorted(graph):
        circle = None if module in seen else reaches(graph, module, module)
        if circle is not None:
            seen |= circle_group(graph, module)
            found.append(circle)
    return found
