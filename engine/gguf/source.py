"""A GGUF file as a model source: found, opened (memory-mapped), its metadata and tensors read once.

`find_gguf(path)`: `path` itself when it is a `.gguf` file, the one `.gguf` file of a directory that has no
`config.json`, else None (a Hugging Face directory). `open_gguf(path)`: the file's metadata and tensors, or a
`GGUFSourceError` naming the file (not a GGUF file, truncated, unreadable).
"""

from __future__ import annotations

import functools
import math
import mmap
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infer.engine.gguf.metadata import TensorInfo
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
    """The file's metadata and tensors: one walk of its header, the tensors views of one read-only memory map."""
    from infer.engine.gguf.metadata import read_gguf_header

    if not _has_magic(path):
        raise GGUFSourceError(f"{path} is not a GGUF file (no GGUF magic at its start)")
    try:
        meta, infos, data_offset = read_gguf_header(path)
    except ValueError as e:  # the message names the file and the field
        raise GGUFSourceError(str(e)) from None
    counts = Counter(info.name for info in infos)
    if len(counts) != len(infos):  # NOTE: counted once, not names.count() a name: 65,536 tensors are allowed
        twice = sorted(name for name, count in counts.items() if count > 1)
        raise GGUFSourceError(f"{path}: tensor {twice[0]!r} comes twice in the file")
    with path.open("rb") as f:
        file_map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return GGUFSource(path, meta, tuple(_tensor(path, file_map, data_offset, info) for info in infos))


@functools.cache
def readable(tensor_type: Any) -> bool:
    """Whether a tensor of this ggml type can be read: a float type, one we decode, or one `gguf.quants`
    dequantizes (the integer types and a few block types it does not: Q1_0, Q8_1, Q8_K)."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES
    from gguf.quants import dequantize

    from infer.engine.gguf.quants import EXACT_TYPES, is_float

    if is_float(tensor_type) or tensor_type in EXACT_TYPES:
        return True
    try:
        dequantize(np.zeros((1, GGML_QUANT_SIZES[tensor_type][1]), dtype=np.uint8), tensor_type)
    except Exception:  # NOTE: NotImplementedError, or whatever else a type it has no table for raises
        return False
    return True


def _tensor(path: Path, file_map: mmap.mmap, data_offset: int, info: TensorInfo) -> FileTensor:
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        tensor_type = GGMLQuantizationType(info.type_id)
    except ValueError:
        raise GGUFSourceError(f"{path}: tensor {info.name!r} has an unknown ggml type {info.type_id}") from None
    if not readable(tensor_type):
        raise GGUFSourceError(
            f"{path}: tensor {info.name!r} is of ggml type {tensor_type.name}, which infer cannot read"
        )
    block_size, type_size = GGML_QUANT_SIZES[tensor_type]
    elements = math.prod(info.dims)
    start, num_bytes = data_offset + info.offset, elements // block_size * type_size
    if info.dims and info.dims[0] % block_size:  # NOTE: a row holds whole blocks (ggml's rule), so rows are views
        raise GGUFSourceError(
            f"{path}: tensor {info.name!r} has rows of {info.dims[0]} values, not whole {tensor_type.name} blocks"
            f" of {block_size}"
        )
    if elements % block_size or start + num_bytes > len(file_map):
        raise GGUFSourceError(f"{path} is truncated or corrupt: tensor {info.name!r} runs past the end of the file")
    shape = tuple(reversed(info.dims))
    data = np.frombuffer(file_map, dtype=np.uint8, count=num_bytes, offset=start)
    return FileTensor(info.name, tensor_type, shape, data, (file_map, start, num_bytes))
