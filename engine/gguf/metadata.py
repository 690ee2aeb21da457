"""A GGUF file's key/value metadata as plain Python values: `{"tokenizer.ggml.tokens": [...], ...}`.

`read_gguf_metadata(path)` walks the header itself through a memory map. NOTE: not with `gguf.GGUFReader`: building
one makes a numpy view of every array element and takes 3.5 s (SmolLM2's 49,152 tokens) to 17-21 s (Gemma 3's
262,144, Qwen's 151,936 tokens and merges) on 2 cores; this walk takes 0.2-0.7 s. A caller that holds a reader
already (for its tensors) passes it, and its fields are read instead (`contents()`, 0.1-0.6 s). Values come out as
`GGUFReader.contents()` gives them; the reader's own `GGUF.*` keys are left out.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gguf import GGUF_DEFAULT_ALIGNMENT as DEFAULT_ALIGNMENT
from gguf import GGUF_MAGIC, GGUFValueType

if TYPE_CHECKING:
    from gguf import GGUFReader

# fixed-size value types -> struct format character
_SCALAR_FORMATS = {
    GGUFValueType.UINT8: "B",
    GGUFValueType.INT8: "b",
    GGUFValueType.UINT16: "H",
    GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I",
    GGUFValueType.INT32: "i",
    GGUFValueType.FLOAT32: "f",
    GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "Q",
    GGUFValueType.INT64: "q",
    GGUFValueType.FLOAT64: "d",
}


class GGUFMetadataError(ValueError):
    """A GGUF header we cannot read; the message names the file."""


def read_gguf_metadata(path: Path, reader: GGUFReader | None = None) -> dict[str, Any]:
    """Every key/value field of the GGUF file at `path`, keyed as in the file."""
    if reader is not None:
        return {key: field.contents() for key, field in reader.fields.items() if not key.startswith("GGUF.")}
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _Header(buf, path).read_fields()
    except (struct.error, ValueError, OSError) as e:
        if isinstance(e, GGUFMetadataError):
            raise
        raise GGUFMetadataError(f"cannot read the GGUF metadata of {path}: {e}") from None


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's entry in the header: dimensions as the file lists them (fastest first), its ggml type, and
    where its bytes start, relative to the data section."""

    name: str
    dims: tuple[int, ...]
    type_id: int
    offset: int


def read_gguf_header(path: Path) -> tuple[dict[str, Any], list[TensorInfo], int]:
    """The metadata, the tensor entries and the data section's byte offset in the file, from one walk of the
    header (no `GGUFReader`: building one costs seconds per 100k-entry array)."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            header = _Header(buf, path)
            fields = header.read_fields()
            tensors = [header.tensor_info() for _ in range(header.tensor_count)]
            alignment = int(fields.get("general.alignment", DEFAULT_ALIGNMENT))
            data_offset = -(-header.pos // alignment) * alignment
    except (struct.error, ValueError, OSError) as e:
        if isinstance(e, GGUFMetadataError):
            raise
        raise GGUFMetadataError(f"cannot read the GGUF header of {path}: {e}") from None
    return fields, tensors, data_offset


class _Header:
    """A cursor over the header: magic, version, counts, then `kv_count` (key, type, value) fields."""

    def __init__(self, buf: mmap.mmap, path: Path) -> None:
        self.buf = buf
        self.path = path
        self.pos = 0
        self.order = "<"
        self.tensor_count = 0

    def read_fields(self) -> dict[str, Any]:
        (magic,) = self.unpack("I")
        if magic != GGUF_MAGIC:
            raise GGUFMetadataError(f"{self.path} is not a GGUF file (no GGUF magic at its start)")
        (version,) = self.unpack("I")
        if version & 0xFFFF == 0:  # written on a big-endian host
            self.order = ">"
            version = struct.unpack(">I", struct.pack("<I", version))[0]
        if version < 2:
            raise GGUFMetadataError(f"{self.path} is GGUF v{version}; only v2 and later are read")
        self.tensor_count, kv_count = self.unpack("QQ")
        fields: dict[str, Any] = {}
        for _ in range(kv_count):
            key = self.string()
            try:
                (value_type,) = self.unpack("I")
                fields[key] = self.value(GGUFValueType(value_type))
            except (struct.error, ValueError) as e:  # truncated, an unknown type, bad UTF-8
                raise GGUFMetadataError(f"cannot read the field {key!r} of {self.path}: {e}") from None
        return fields

    def tensor_info(self) -> TensorInfo:
        name = self.string()
        (n_dims,) = self.unpack("I")
        dims = self.unpack(f"{n_dims}Q")
        type_id, offset = self.unpack("IQ")
        return TensorInfo(name, tuple(int(d) for d in dims), int(type_id), int(offset))

    def unpack(self, fmt: str) -> tuple[Any, ...]:
        values = struct.unpack_from(self.order + fmt, self.buf, self.pos)
        self.pos += struct.calcsize(self.order + fmt)
        return values

    def string(self) -> str:
        (length,) = self.unpack("Q")
        start, self.pos = self.pos, self.pos + length
        if self.pos > len(self.buf):
            raise GGUFMetadataError(f"{self.path} is truncated (a string runs past the end of the file)")
        return self.buf[start : self.pos].decode("utf-8")

    def strings(self, count: int) -> list[str]:
        """`count` strings in a row (a vocabulary: 150k-260k of them), in one tight loop."""
        buf, pos, end = self.buf, self.pos, len(self.buf)
        out: list[str] = []
        length_of = struct.Struct(self.order + "Q").unpack_from
        append = out.append
        for _ in range(count):
            (length,) = length_of(buf, pos)
            start, pos = pos + 8, pos + 8 + length
            if pos > end:
                raise GGUFMetadataError(f"{self.path} is truncated (a string runs past the end of the file)")
            append(buf[start:pos].decode("utf-8"))
        self.pos = pos
        return out

    def value(self, value_type: GGUFValueType) -> Any:
        if value_type == GGUFValueType.STRING:
            return self.string()
        if value_type != GGUFValueType.ARRAY:
            return self.unpack(_SCALAR_FORMATS[value_type])[0]
        element_type, count = self.unpack("IQ")
        element_type = GGUFValueType(element_type)
        if element_type in _SCALAR_FORMATS:  # one unpack for the whole array (token types, scores)
            return list(self.unpack(f"{count}{_SCALAR_FORMATS[element_type]}"))
        if element_type == GGUFValueType.STRING:
            return self.strings(count)
        return [self.value(element_type) for _ in range(count)]  # arrays of arrays
