"""The server sees the engine through one interface: `infer.engine`'s public names, never its insides."""

from __future__ import annotations

import ast
from pathlib import Path

import infer.engine
from tests.helpers.imports import imports_from

SERVER_DIR = Path(__file__).resolve().parents[3] / "server"


def test_server_imports_only_the_engines_public_names() -> None:
    files = sorted(SERVER_DIR.rglob("*.py"))
    assert len(files) > 10
    imports = {
        (str(f.relative_to(SERVER_DIR)), module, name)
        for f in files
        for module, name in imports_from(f, "infer.engine")
    }
    assert imports, "the server must import the engine somewhere"
    outside = sorted((f, m, n) for f, m, n in imports if m != "infer.engine" or n not in infer.engine.__all__)
    assert outside == [], "import these from `infer.engine` (add to its __all__ if they are public)"


def test_server_never_reaches_into_the_engine_core() -> None:
    for path in sorted(SERVER_DIR.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        uses = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr == "core"]
        assert uses == [], f"{path.name}:{uses}: use the EngineClient interface, not `.core`"


def test_every_public_name_resolves() -> None:
    for name in infer.engine.__all__:
        assert getattr(infer.engine, name) is not None
