"""Regenerate the Python stubs of `proto/infer/v1/*.proto` into `api/v1/` (`make proto`).

protoc names modules after the proto path (`infer.v1.inference_pb2`); the stubs live in
`infer.api.v1`, so their imports are rewritten. Needs grpcio-tools (the `dev` extra).
"""

from __future__ import annotations

import re
import sys
import tempfile
from importlib import resources
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PROTO_ROOT = REPO_ROOT / "proto"
PROTO_PACKAGE = "infer/v1"  # folder under PROTO_ROOT
OUT_DIR = Path(__file__).resolve().parent / "v1"
TARGET_MODULE = "infer.api.v1"

INIT = '"""Generated gRPC stubs of the infer.v1 proto. Do not edit: run `make proto`."""\n'
_IMPORT = re.compile(r"\bfrom infer\.v1 import\b")
_MODULE = re.compile(r"'infer\.v1\.(\w+_pb2)'")


def _rewrite(text: str) -> str:
    text = _IMPORT.sub(f"from {TARGET_MODULE} import", text)
    return _MODULE.sub(rf"'{TARGET_MODULE}.\1'", text)


def generate(out_dir: Path, proto_root: Path = PROTO_ROOT) -> list[Path]:
    """Write the stubs (and an `__init__.py`) into out_dir; returns the files written."""
    from grpc_tools import protoc  # dev-only dependency

    protos = sorted(p.relative_to(proto_root).as_posix() for p in (proto_root / PROTO_PACKAGE).glob("*.proto"))
    if not protos:
        raise FileNotFoundError(f"no .proto files under {proto_root / PROTO_PACKAGE}")
    well_known = resources.files("grpc_tools") / "_proto"
    with tempfile.TemporaryDirectory() as tmp:
        args = ["protoc", f"-I{proto_root}", f"-I{well_known}"]
        args += [f"--python_out={tmp}", f"--pyi_out={tmp}", f"--grpc_python_out={tmp}", *protos]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed: {' '.join(args)}")
        out_dir.mkdir(parents=True, exist_ok=True)
        written = [out_dir / "__init__.py"]
        written[0].write_text(INIT)
        for generated in sorted((Path(tmp) / PROTO_PACKAGE).iterdir()):
            target = out_dir / generated.name
            target.write_text(_rewrite(generated.read_text()))
            written.append(target)
    return written


def main() -> int:
    for path in generate(OUT_DIR):
        print(f"wrote {path.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
