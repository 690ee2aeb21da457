"""`infer generate --model FILE` and `infer serve --model FILE` on a model file that is malformed or lies: exit
code 2 and one line naming the file, never a traceback, a hang or a MemoryError."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from infer.server.cli import main
from tests.helpers.gguf_layout import patched, slot
from tests.helpers.tiny_gguf import write_tiny_gguf


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("cli") / "tiny.gguf", "llama", num_layers=1)


def _block_count(value: int) -> Callable[[Path, Path], Path]:
    def make(tiny: Path, d: Path) -> Path:
        out = d / "lies.gguf"
        out.write_bytes(patched(tiny.read_bytes(), slot(tiny, "llama.block_count"), value))
        return out

    return make


def _write(name: str, data: bytes) -> Callable[[Path, Path], Path]:
    def make(tiny: Path, d: Path) -> Path:
        (d / name).write_bytes(data)
        return d / name

    return make


def _fifo(tiny: Path, d: Path) -> Path:
    os.mkfifo(d / "fifo.gguf")
    return d / "fifo.gguf"


def _two_files(tiny: Path, d: Path) -> Path:
    for name in ("a.gguf", "b.gguf"):
        (d / name).write_bytes(tiny.read_bytes())
    return d


def _truncated(tiny: Path, d: Path) -> Path:
    (d / "cut.gguf").write_bytes(tiny.read_bytes()[:3000])
    return d / "cut.gguf"


def _empty_dir(tiny: Path, d: Path) -> Path:
    (d / "empty").mkdir()
    return d / "empty"


CASES = {
    "block_count 1e6": _block_count(1_000_000),
    "block_count 4e9": _block_count(4_000_000_000),
    "block_count 2 of 1": _block_count(2),
    "empty file": _write("empty.gguf", b""),
    "no magic": _write("zeros.gguf", bytes(4096)),
    "random bytes": _write("random.gguf", b"GGUF" + os.urandom(4092)),
    "a directory": _empty_dir,
    "a FIFO": _fifo,
    "two GGUFs in one folder": _two_files,
    "a truncated header": _truncated,
}


@pytest.mark.parametrize("case", CASES)
def test_generate_exits_2_with_one_line(
    tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    path = CASES[case](tiny, tmp_path)
    start = time.perf_counter()
    assert main(["generate", "--model", str(path), "--max-tokens", "1", "Hi"]) == 2
    assert time.perf_counter() - start < 5.0  # NOTE: the first call imports the command line's modules
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err


def test_serve_exits_2_on_a_block_count_of_a_million(tiny: Path, tmp_path: Path) -> None:
    from infer.engine import EngineConfig
    from infer.server.app import serve
    from infer.server.settings import ServerConfig

    path = _block_count(1_000_000)(tiny, tmp_path)
    config = ServerConfig(engine=EngineConfig(model=str(path)), grpc_port=0, metrics_port=None, http_port=None)
    start = time.perf_counter()
    assert asyncio.run(serve(config)) == 2
    assert time.perf_counter() - start < 5.0
