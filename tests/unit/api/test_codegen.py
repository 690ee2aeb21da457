"""The committed Python stubs are what `make proto` generates from proto/ today, and they load on their own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from infer.api import codegen


def test_committed_stubs_are_up_to_date(tmp_path: Path) -> None:
    generated = {p.name: p.read_text() for p in codegen.generate(tmp_path)}
    committed = {p.name: p.read_text() for p in codegen.OUT_DIR.iterdir() if p.is_file()}
    assert sorted(committed) == sorted(generated), "stale stubs: run `make proto`"
    stale = [name for name, text in generated.items() if committed[name] != text]
    assert not stale, f"stale stubs {stale}: run `make proto`"


# run in a fresh interpreter: what `import infer.api` (then `import infer.clients`) loads
LOADS_ALONE = """
import sys
from infer.api import pb, pb_grpc
assert pb.GenerateRequest.__module__ == "infer.api.v1.inference_pb2"
assert pb_grpc.InferenceServiceStub.__module__ == "infer.api.v1.inference_pb2_grpc"
others = ("torch", "infer.engine", "infer.clients", "infer.server")
assert not [m for m in sys.modules if m.startswith(others)], "infer.api imports more than the stubs"
import infer.clients
assert not [m for m in sys.modules if m.startswith(others[:2])], "the clients import the engine"
"""


def test_the_contract_imports_without_the_engine_or_the_clients() -> None:
    result = subprocess.run([sys.executable, "-c", LOADS_ALONE], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
