"""What a source file imports from a package, read with `ast` (the import-boundary tests)."""

from __future__ import annotations

import ast
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
