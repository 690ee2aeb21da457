"""A GGUF file's key/value metadata as plain Python values: `{"tokenizer.ggml.tokens": [...], ...}`.

`read_gguf_metadata(path)` walks the header itself through a memory map. NOTE: not with `gguf.GGUFReader`: building
one makes a numpy view of every array element and takes 3.5 s (SmolLM2's 49,152 tokens) to 17-21 s (Gemma 3's
262,144, Qwen's 151,936 tokens and merges) on 2 cores; this walk takes 0.2-0.7 s. A caller that holds a reader
already (for its tensors) passes it, and its fields are read instead (`contents()`, 0.1-0.6 s). Values come out as
`GGUFReader.contents()` gives them; the reader's own `GGUF.*` keys are left out.

The file is a stranger's: no count in it is trusted. Before anything is read or allocated, each count, length and
dimension is checked against the bytes left in the file (a string of n bytes needs n of them; an array of n
values at least n times the smallest value's size; a tensor entry at least 24), against `MAX_STRING_BYTES` (a
value) and `MAX_NAME_BYTES` (a key, a tensor's name), `MAX_FIELDS`,
`MAX_TENSORS`, `MAX_ARRAY_ELEMENTS` per array and `MAX_METADATA_ELEMENTS` in all, and against `MAX_DIMS`
dimensions and `MAX_ARRAY_DEPTH` levels of arrays in arrays: so what the walk allocates is bounded by the file's
size, and a lie is a `GGUFMetadataError` naming the field (or the tensor entry) and the file.
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
MIN_STRING_BYTES = 8  # its length; the text may be empty
MIN_ARRAY_BYTES = 12  # its element type and count; it may be empty
MIN_FIELD_BYTES = MIN_STRING_BYTES + 4 + 1  # a key, its type and the smallest value (a uint8 or a bool)
MIN_TENSOR_BYTES = MIN_STRING_BYTES + 4 + 4 + 8  # a name, n_dims, the type and the offset (no dimensions)
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
MAX_ARRAY_DEPTH = 3  # arrays of arrays of arrays at most
# NOTE: the largest real vocabularies hold 262,144 tokens (Gemma 3: with scores and types, and 514,906 merges,
# 1.3M values in all); these are 16x and 6x that, and bound what a header's Python lists take (~60 bytes each)
MAX_ARRAY_ELEMENTS = 1 << 22
MAX_METADATA_ELEMENTS = 1 << 23
# NOTE: a chat template, the longest string of real files, is 1-50 KB; a string that runs on into the tensor data
# (a length that lies, inside the file) would otherwise be copied and decoded whole: 2x a 1 GB file
MAX_STRING_BYTES = 1 << 24
MAX_NAME_BYTES = 1 << 10  # a key or a tensor's name (llama.cpp's tensor names: 64 at most)
MAX_FIELDS = 1 << 16  # real files have 20-60
MAX_TENSORS = 1 << 16  # real files have 100-3,000 (a model's experts are stacked in one tensor per layer)


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
            tensors = [header.tensor_info(i) for i in range(header.tensor_count)]
            alignment = _alignment(fields, path)
            data_offset = -(-header.pos // alignment) * alignment
            if data_offset > len(buf):
                raise GGUFMetadataError(f"{path} is truncated (its data section would start past the end)")
    except (struct.error, ValueError, OSError) as e:
        if isinstance(e, GGUFMetadataError):
            raise
        raise GGUFMetadataError(f"cannot read the GGUF header of {path}: {e}") from None
    return fields, tensors, data_offset


def _alignment(fields: dict[str, Any], path: Path) -> int:
    """`general.alignment`: a power of two (llama.cpp's rule), 32 when the file has none."""
    alignment = fields.get("general.alignment", DEFAULT_ALIGNMENT)
    if type(alignment) is not int or alignment < 1 or alignment & (alignment - 1) or alignment > 1 << 30:
        raise GGUFMetadataError(f"{path}: general.alignment must be a power of two, not {alignment!r}")
    return alignment


class _Header:
    """A cursor over the header: magic, version, counts, then `kv_count` (key, type, value) fields."""

    def __init__(self, buf: mmap.mmap, path: Path) -> None:
        self.buf = buf
        self.path = path
        self.pos = 0
        self.order = "<"
        self.tensor_count = 0
        self.elements = 0  # array values read so far, against MAX_METADATA_ELEMENTS

    @property
    def left(self) -> int:
        """Bytes of the file after the cursor."""
        return len(self.buf) - self.pos

    def read_fields(self) -> dict[str, Any]:
        (magic,) = self.unpack("I")
        if magic != GGUF_MAGIC:
            raise GGUFMetadataError(f"{self.path} is not a GGUF file (no GGUF magic at its start)")
        (version,) = self.unpack("I")
        if version & 0xFFFF == 0:  # written on a big-endian host
            self.order = ">"
            version = struct.unpack(">I", struct.pack("<I", version))[0]
        if version not in (2, 3):
            raise GGUFMetadataError(f"{self.path} is GGUF v{version}; v2 and v3 are read")
        self.tensor_count, kv_count = self.unpack("QQ")
        if kv_count * MIN_FIELD_BYTES + self.tensor_count * MIN_TENSOR_BYTES > self.left:
            raise GGUFMetadataError(
                f"{self.path} is truncated or corrupt: its header counts ({kv_count} fields, {self.tensor_count}"
                f" tensors) need more than the {self.left} bytes it has left"
            )
        if kv_count > MAX_FIELDS or self.tensor_count > MAX_TENSORS:
            raise GGUFMetadataError(
                f"{self.path}: its header counts ({kv_count} fields, {self.tensor_count} tensors) are past the bounds"
                f" ({MAX_FIELDS} fields, {MAX_TENSORS} tensors)"
            )
        fields: dict[str, Any] = {}
        for index in range(kv_count):
            key = self.key(index)
            if key in fields:
                raise GGUFMetadataError(f"{self.path}: the field {key!r} comes twice")
            try:
                (value_type,) = self.unpack("I")
                fields[key] = self.value(GGUFValueType(value_type), depth=0)
            except (struct.error, ValueError) as e:  # truncated, an unknown type, bad UTF-8, a count that lies
                raise GGUFMetadataError(f"cannot read the field {key!r} of {self.path}: {e}") from None
        return fields

    def key(self, index: int) -> str:
        try:
            return self.string(MAX_NAME_BYTES)
        except (struct.error, ValueError) as e:
            raise GGUFMetadataError(f"cannot read the key of field #{index} of {self.path}: {e}") from None

    def tensor_info(self, index: int) -> TensorInfo:
        try:
            name = self.string(MAX_NAME_BYTES)
        except (struct.error, ValueError) as e:
            raise GGUFMetadataError(f"cannot read the name of tensor #{index} of {self.path}: {e}") from None
        try:
            (n_dims,) = self.unpack("I")
            if not 1 <= n_dims <= MAX_DIMS:
                raise ValueError(f"{n_dims} dimensions (1 to {MAX_DIMS})")
            dims = self.unpack(f"{n_dims}Q")
            type_id, offset = self.unpack("IQ")
        except (struct.error, ValueError) as e:
            raise GGUFMetadataError(f"cannot read the entry of tensor {name!r} of {self.path}: {e}") from None
        return TensorInfo(name, tuple(int(d) for d in dims), int(type_id), int(offset))

    def unpack(self, fmt: str) -> tuple[Any, ...]:
        values = struct.unpack_from(self.order + fmt, self.buf, self.pos)
        self.pos += struct.calcsize(self.order + fmt)
        return values

    def string(self, limit: int = MAX_STRING_BYTES) -> str:
        (length,) = self.unpack("Q")
        if length > self.left:
            raise ValueError(f"truncated or corrupt: a string of {length} bytes runs past the end of the file")
        if length > limit:
            raise ValueError(f"a string of {length} bytes (at most {limit})")
        start, self.pos = self.pos, self.pos + length
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
                raise ValueError(f"truncated or corrupt: a string of {length} bytes runs past the end of the file")
            if length > MAX_STRING_BYTES:
                raise ValueError(f"a string of {length} bytes (at most {MAX_STRING_BYTES})")
            append(buf[start:pos].decode("utf-8"))
        self.pos = pos
        return out

    def value(self, value_type: GGUFValueType, depth: int) -> Any:
        if value_type == GGUFValueType.STRING:
            return self.string()
        if value_type != GGUFValueType.ARRAY:
            return self.unpack(_SCALAR_FORMATS[value_type])[0]
        element_type, count = self.unpack("IQ")
        element_type = GGUFValueType(element_type)
        self.check_array(element_type, count, depth)
        if element_type in _SCALAR_FORMATS:  # one unpack for the whole array (token types, scores)
            return list(self.unpack(f"{count}{_SCALAR_FORMATS[element_type]}"))
        if element_type == GGUFValueType.STRING:
            return self.strings(count)
        return [self.value(element_type, depth + 1) for _ in range(count)]  # arrays of arrays

    def check_array(self, element_type: GGUFValueType, count: int, depth: int) -> None:
        """ValueError for an array the file cannot hold, or one past the bounds, before anything is read."""
        if depth >= MAX_ARRAY_DEPTH:
            raise ValueError(f"arrays nested more than {MAX_ARRAY_DEPTH} deep")
        if element_type in _SCALAR_FORMATS:
            smallest = struct.calcsize(_SCALAR_FORMATS[element_type])
        else:
            smallest = MIN_STRING_BYTES if element_type == GGUFValueType.STRING else MIN_ARRAY_BYTES
        kind = element_type.name.lower()
        if count * smallest > self.left:
            raise ValueError(f"truncated or corrupt: {count} {kind} values cannot fit in the {self.left} bytes left")
        if count > MAX_ARRAY_ELEMENTS:
            raise ValueError(f"an array of {count} {kind} values (at most {MAX_ARRAY_ELEMENTS})")
        self.elements += count
        if self.elements > MAX_METADATA_ELEMENTS:
            raise ValueError(f"more than {MAX_METADATA_ELEMENTS} array values in the metadata")
