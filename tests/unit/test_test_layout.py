"""The suite's own layout: pytest imports a test file outside a package by its basename alone, so two such files
with one name stop the whole collection ("import file mismatch")."""

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _module_name(path: Path) -> str:
    """The name pytest imports `path` under: dotted from the top package folder, or the basename alone."""
    parts = [path.stem]
    folder = path.parent
    while (folder / "__init__.py").exists():
        parts.insert(0, folder.name)
        folder = folder.parent
    return ".".join(parts)


def test_no_two_test_modules_share_an_import_name() -> None:
    names = Counter(_module_name(p) for p in TESTS.rglob("test_*.py"))
    assert [name for name, count in names.items() if count > 1] == []
