"""The committed Python stubs are what `make proto` generates from proto/ today."""

from __future__ import annotations

from pathlib import Path

from infer.clients.proto import codegen


def test_committed_stubs_are_up_to_date(tmp_path: Path) -> None:
    generated = {p.name: p.read_text() for p in codegen.generate(tmp_path)}
    committed = {p.name: p.read_text() for p in codegen.OUT_DIR.iterdir() if p.is_file()}
    assert sorted(committed) == sorted(generated), "stale stubs: run `make proto`"
    stale = [name for name, text in generated.items() if committed[name] != text]
    assert not stale, f"stale stubs {stale}: run `make proto`"


def test_stubs_import_from_the_clients_package_without_the_engine() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from infer.clients.proto.v1 import inference_pb2, inference_pb2_grpc\n"
        "import infer.clients\n"
        "assert inference_pb2.GenerateRequest.__module__ == 'infer.clients.proto.v1.inference_pb2'\n"
        "assert not [m for m in sys.modules if m.startswith(('torch', 'infer.engine'))], 'engine imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
