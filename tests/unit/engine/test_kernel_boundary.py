"""The engine sees the kernels through one interface: `infer.kernels`' public names, never a backend's insides;
model code runs ops on the `Kernels` it is given and never chooses a backend."""

from __future__ import annotations

import ast
from pathlib import Path

import infer.kernels
from tests.helpers.imports import imports_from

ENGINE_DIR = Path(__file__).resolve().parents[3] / "engine"


def _imports_by_file(folder: Path) -> set[tuple[str, str, str]]:
    files = sorted(folder.rglob("*.py"))
    return {(str(f.relative_to(ENGINE_DIR)), m, n) for f in files for m, n in imports_from(f, "infer.kernels")}


def test_the_engine_imports_only_the_kernel_interface() -> None:
    imports = _imports_by_file(ENGINE_DIR)
    assert any(f.startswith("models/") for f, _, _ in imports), "the models must run on the kernel interface"
    outside = sorted((f, m, n) for f, m, n in imports if m != "infer.kernels" or n not in infer.kernels.__all__)
    assert outside == [], "import these from `infer.kernels` (add to its __all__ if models need them)"


def test_models_never_choose_a_backend() -> None:
    imports = _imports_by_file(ENGINE_DIR)
    chooses = sorted(f for f, _, n in imports if n == "select_kernels")
    assert chooses == ["loader.py"], "the backend is chosen once, when the model is loaded"
    names = sorted(f for f, _, n in imports if n == "BACKENDS")
    assert names == ["config.py"], "the backends' names only check the `kernels` setting, in the config"


def test_no_compiled_or_triton_kernel_is_called_from_the_engine() -> None:
    for path in sorted(ENGINE_DIR.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        modules = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        modules += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        ops = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "infer_cpu"]
        assert not any(m.split(".")[0] == "triton" for m in modules), f"{path.name} imports triton"
        assert ops == [], f"{path.name}:{ops}: call the compiled kernels through `Kernels`"


def test_every_public_name_resolves() -> None:
    for name in infer.kernels.__all__:
        assert getattr(infer.kernels, name) is not None
