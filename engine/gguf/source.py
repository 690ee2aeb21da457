"""A GGUF file as a model source: found, opened (memory-mapped), its metadata and tensors read once.

`find_gguf(path)`: `path` itself when it is a `.gguf` file, the one `.gguf` file of a directory that has no
`config.json`, else None (a Hugging Face directory). `open_gguf(path)`: the file's metadata and tensors, or a
`GGUFSourceError` naming the file (not a GGUF file, truncated, unreadable).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infer.engine.gguf.weights import FileTensor

GGUF_MAGIC = b"GGUF"


class GGUFSourceError(ValueError):
    """A GGUF file we cannot read; the message names the file."""


@dataclass(frozen=True)
class GGUFSource:
    path: Path
    meta: dict[str, Any]  # every key/value field, as plain Python values
    tensors: tuple[FileTensor, ...]

    @property
    def name(self) -> str:
        """How clients see the model: the file's name without `.gguf`."""
        return self.path.name.removesuffix(".gguf")

    def tensor(self, name: str) -> FileTensor | None:
        return next((t for t in self.tensors if t.name == name), None)


def find_gguf(path: Path) -> Path | None:
    if path.is_file():
        return path if path.suffix == ".gguf" or _has_magic(path) else None
    if not path.is_dir() or (path / "config.json").exists():
        return None
    found = sorted(path.glob("*.gguf"))
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise GGUFSourceError(f"{path} holds several GGUF files ({names}): name one with --model")
    return found[0] if found else None


def _has_magic(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def open_gguf(path: Path) -> GGUFSource:
    from gguf import GGUFReader

    from infer.engine.gguf.metadata import read_gguf_metadata

    if not _has_magic(path):
        raise GGUFSourceError(f"{path} is not a GGUF file (no GGUF magic at its start)")
    try:
        reader = GGUFReader(path)
        tensors = tuple(FileTensor.from_reader(t) for t in reader.tensors)
        meta = read_gguf_metadata(path, reader)
    except (ValueError, IndexError, KeyError, OSError) as e:  # gguf raises these on truncated or corrupt files
        message = str(e) if str(path) in str(e) else f"{path} is truncated or corrupt: {e}"
        raise GGUFSourceError(message) from None
    return GGUFSource(path, meta, tensors)
