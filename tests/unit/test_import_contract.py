"""Who owns what: the gRPC contract lives in `infer.api` and everything that speaks the protocol (the server, the
gateway, the clients) imports it from there; the models run on the kernel interface, never a backend's insides."""

from __future__ import annotations

import ast
import itertools
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import infer.api
import infer.kernels
from tests.helpers.imports import circle_group, circles, import_graph, imports_from, infer_modules, reaches
from tests.helpers.tiny_gguf import write_tiny_gguf

ROOT = Path(__file__).resolve().parents[2]
SPEAKERS = ("server", "clients")  # server/ holds the gateway (server/gateway/)
STUB_MODULES = {"inference_pb2", "inference_pb2_grpc"}
CONTRACT_NAMES = set(infer.api.__all__) | STUB_MODULES


def _files(*folders: str) -> list[Path]:
    files = sorted(f for folder in folders for f in (ROOT / folder).rglob("*.py"))
    assert len(files) > 10
    return files


def _imports(path: Path) -> Iterator[tuple[str, str]]:
    """(module, name) of every import in a file; name is "" for a plain `import module`."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            yield from ((node.module or "", alias.name) for alias in node.names)
        elif isinstance(node, ast.Import):
            yield from ((alias.name, "") for alias in node.names)


def _where(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_server_gateway_and_clients_take_the_contract_from_infer_api() -> None:
    found, elsewhere = set(), []
    for path in _files(*SPEAKERS):
        for module, name in _imports(path):
            is_stub = module.split(".")[-1] in STUB_MODULES or "proto" in module.split(".")
            if name in CONTRACT_NAMES or (module.startswith("infer.") and is_stub):
                found.add(_where(path).split("/")[0] + ("/gateway" if "/gateway/" in _where(path) else ""))
                if module != "infer.api":
                    elsewhere.append(f"{_where(path)}: from {module} import {name}")
    assert elsewhere == [], "import the stubs and the shared names from `infer.api` (`from infer.api import pb`)"
    assert found == {"server", "server/gateway", "clients"}, found


def _assigned_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def _string_collections(tree: ast.Module) -> Iterator[set[str]]:
    """The strings of every tuple, list or set of string literals (a `Literal[...]`'s arguments included)."""
    for node in ast.walk(tree):
        elts = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else []
        strings = [e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        if strings and len(strings) == len(elts):
            yield set(strings)


def test_nothing_defines_the_contract_a_second_time() -> None:
    """No module but infer.api assigns a contract name, or spells out the chat roles or the finish reasons."""
    roles, reasons = set(infer.api.CHAT_ROLES), set(infer.api.FINISH_REASONS.values())
    again = []
    for path in _files(*SPEAKERS):
        tree = ast.parse(path.read_text(), str(path))
        again += [f"{_where(path)}: {name} =" for name in sorted(_assigned_names(tree) & CONTRACT_NAMES)]
        again += [f"{_where(path)}: {sorted(s)}" for s in _string_collections(tree) if s in (roles, reasons)]
    assert again == [], "take these from `infer.api`"


def _docstrings(tree: ast.Module) -> set[int]:
    """The ids of the docstring nodes: prose may name the contract's values."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _spellings(text: str, *, in_f_string: bool) -> list[str]:
    """The contract's wire names that a literal spells: the service name (also inside a method path), the
    authorization metadata key, the Bearer scheme (alone, or an f-string's `Bearer {key}` part)."""
    words = text.strip().lower()
    found = [infer.api.SERVICE_NAME] if infer.api.SERVICE_NAME.lower() in text.lower() else []
    if words == infer.api.API_KEY_METADATA:
        found.append(infer.api.API_KEY_METADATA)
    if words == infer.api.BEARER.lower() or (in_f_string and text.lower().endswith(f"{infer.api.BEARER.lower()} ")):
        found.append(infer.api.BEARER)
    return found


def _spelled_names(path: Path) -> Iterator[tuple[int, str]]:
    """(line, name) of every literal outside a docstring that spells a contract name."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = _docstrings(tree)
    in_f_strings = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str | bytes) and id(node) not in docstrings:
            text = node.value.decode("latin-1") if isinstance(node.value, bytes) else node.value
            for name in _spellings(text, in_f_string=id(node) in in_f_strings):
                yield node.lineno, name


def test_the_service_name_the_key_header_and_the_bearer_scheme_are_spelled_once() -> None:
    """Only infer.api spells them; everything else takes SERVICE_NAME, API_KEY_METADATA, BEARER or bearer()."""
    again = [f"{_where(path)}:{line}: {name!r}" for path in _files(*SPEAKERS) for line, name in _spelled_names(path)]
    assert again == [], "take these from `infer.api`"


def test_a_second_spelling_is_found(tmp_path: Path) -> None:
    source = tmp_path / "spelled.py"
    source.write_text(
        '''"""Docstrings may say infer.v1.InferenceService and 'authorization: Bearer <key>'."""
KEY = "authorization"
HEADER = b"Authorization"
SCHEME = "bearer "
METHOD = f"infer.v1.InferenceService/{name}"
VALUE = f"Bearer {key}"
HELP = "send 'authorization: Bearer <key>'"  # prose: not a spelling
'''
    )
    service, key, scheme = infer.api.SERVICE_NAME, infer.api.API_KEY_METADATA, infer.api.BEARER
    assert sorted(_spelled_names(source)) == [(2, key), (3, key), (4, scheme), (5, service), (6, scheme)]


def test_only_infer_api_holds_the_stubs() -> None:
    found = ROOT.glob("[!.]*/**/*_pb2*.py*")
    stubs = sorted(_where(p) for p in found if p.suffix in (".py", ".pyi") and "node_modules" not in p.parts)
    assert stubs and all(s.startswith("api/v1/") for s in stubs), stubs


def test_models_import_only_the_kernel_interface() -> None:
    """engine/models run ops on the `Kernels` they are given: `infer.kernels`' public names (or its interface
    module), never a backend's module (reference, cpu, compiled, *_triton), and they never choose one."""
    public = set(infer.kernels.__all__) - {"select_kernels", "BACKENDS"}
    outside = []
    for path in sorted((ROOT / "engine" / "models").rglob("*.py")):
        for module, name in imports_from(path, "infer.kernels"):
            if not (module == "infer.kernels" and name in public) and module != "infer.kernels.interface":
                outside.append(f"{_where(path)}: from {module} import {name}")
        modules = {m.split(".")[0] for m, _ in _imports(path)}
        assert "triton" not in modules, f"{_where(path)} imports triton"
    assert outside == [], "models take ops from the `Kernels` interface"


# --- no circles: the imports between infer's modules point one way

# imports a circle may still run through, each with why it is left and who cuts it; an entry whose import is gone
# or no longer closes a circle fails the test below (take it out)
CIRCLE_EDGES_LEFT: dict[tuple[str, str], str] = {}


def _circle_text(graph: dict[str, dict[str, int]], modules: dict[str, Path], circle: list[str]) -> str:
    steps = [f"{_where(modules[a])}:{graph[a][b]} imports {b}" for a, b in itertools.pairwise(circle)]
    others = sorted(circle_group(graph, circle[0]) - set(circle))
    return (
        " -> ".join(circle) + "".join(f"\n    {line}" for line in steps) + (f"\n    (and {others})" if others else "")
    )


def test_no_modules_import_each_other_in_a_circle() -> None:
    """Every import counts (under TYPE_CHECKING, inside a function: `module_imports`): a circle that a
    function-local import hides still ties its modules together. Cut it where an interface belongs: the types
    both sides need in a leaf module that imports neither."""
    modules = infer_modules(ROOT)
    graph = import_graph(modules)
    stale = [edge for edge in CIRCLE_EDGES_LEFT if reaches(graph, edge[1], edge[0]) is None]
    assert stale == [], f"these imports close no circle now: take them out of CIRCLE_EDGES_LEFT: {stale}"
    for importer, imported in CIRCLE_EDGES_LEFT:
        del graph[importer][imported]
    found = [_circle_text(graph, modules, circle) for circle in circles(graph)]
    assert found == [], "modules that import each other:\n" + "\n".join(found)


def test_a_circle_is_found_however_its_imports_hide(tmp_path: Path) -> None:
    sources = {
        "pkg/__init__.py": "from pkg.a import A\n",  # gathers its modules' names: no circle
        "pkg/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\nclass A: ...\n",
        "pkg/b.py": "def b():\n    from pkg import a\n",  # a function-local import
        "pkg/c.py": "from pkg import A\nfrom . import d\n",  # from the __init__ (which does not import c)
        "pkg/d.py": "import os\n",
        "sub/__init__.py": "from sub.x import X\nHELP = 1\n",
        "sub/x.py": "from sub import HELP\nX = HELP\n",  # a name from its own package's __init__
    }
    for name, text in sources.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    modules = {
        name.removesuffix(".py").removesuffix("/__init__").replace("/", "."): tmp_path / name for name in sources
    }
    graph = import_graph(modules)
    assert graph["pkg.c"] == {"pkg": 1, "pkg.d": 2}
    assert circles(graph) == [["pkg.a", "pkg.b", "pkg.a"], ["sub", "sub.x", "sub"]]
    del graph["pkg.b"]["pkg.a"], graph["sub.x"]["sub"]
    assert circles(graph) == []


# --- start-up: what `infer serve` leaves for later

# imported on first use, never before SERVING: xgrammar by the first constrained request (its trial worker, a
# process, with it), transformers never when serving a GGUF file, Triton only on CUDA, the client-side commands
LAZY_MODULES = ("xgrammar", "transformers", "accelerate", "triton", "infer.clients.bench", "infer.clients.cli")
SERVE_UNTIL_SERVING = """
import asyncio, sys
from infer.engine.structured.grammar_budget import trial_worker
from infer.server.cli import build_parser
from infer.server.settings import config_from_args
argv = ["serve", "--model", sys.argv[1], "--host", "127.0.0.1", "--grpc-port", "0", "--http-port", "0",
        "--metrics-port", "off", "--max-model-len", "64", "--num-blocks", "16"]
config = config_from_args(build_parser(argv).parse_args(argv))
from infer.server.app import InferenceServer, start_gateway

async def serve():
    server = InferenceServer(config)
    await server.start()
    gateway = await start_gateway(server)
    await server.load()
    assert server.engine is not None  # SERVING
    lazy = sys.argv[2].split(",")
    imported = sorted(m for m in sys.modules if any(m == name or m.startswith(name + ".") for name in lazy))
    await asyncio.gather(server.stop(grace_s=0), gateway.stop())
    return imported

imported = asyncio.run(serve())
print(",".join(sorted({m.split(".")[0] if not m.startswith("infer.") else m for m in imported})))
print(trial_worker().pid)
"""


def test_serving_a_gguf_file_imports_nothing_it_needs_only_later(tmp_path: Path) -> None:
    """Time to SERVING (issue 26): `infer serve` up to SERVING, warm-up included, imports none of the lazy modules
    and starts no grammar worker; a module-level import of one of them would add its import to every start."""
    model = write_tiny_gguf(tmp_path / "tiny.gguf", "llama", num_layers=1)
    argv = [sys.executable, "-c", SERVE_UNTIL_SERVING, str(model), ",".join(LAZY_MODULES)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    imported, worker = result.stdout.splitlines()[-2:]
    assert imported == "", f"imported before SERVING: {imported}"
    assert worker == "None", "the grammar trial worker started before SERVING"
