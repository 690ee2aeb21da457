"""Where each number of a (valid) GGUF header lies, so that tests and the model-file fuzzer can make it lie.

`header_slots(path)` walks the header once and lists every count, length, type, scalar value, dimension and
offset as a `Slot` (its byte offset, struct format and what it is); `patched(data, slot, value)` writes a new
value into a copy of the bytes, the rest of the file unchanged. Little-endian files only (ours and llama.cpp's).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf import GGUFValueType

_SCALARS = {
    GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H", GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i", GGUFValueType.FLOAT32: "f", GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "Q", GGUFValueType.INT64: "q", GGUFValueType.FLOAT64: "d",
}  # fmt: skip


@dataclass(frozen=True)
class Slot:
    offset: int  # in the file
    fmt: str  # struct format of the number (little-endian)
    kind: str  # count | length | type | value | dim | offset
    label: str  # what it is: "tensor_count", "llama.block_count", "tokenizer.ggml.tokens[3] length", ...

    @property
    def size(self) -> int:
        return struct.calcsize("<" + self.fmt)

    def read(self, data: bytes | bytearray) -> int | float | bool:
        value: int | float | bool = struct.unpack_from("<" + self.fmt, data, self.offset)[0]
        return value


def patched(data: bytes | bytearray, slot: Slot, value: int | float) -> bytearray:
    """A copy of `data` with `value` (wrapped to the slot's width for whole numbers) at `slot`."""
    out = bytearray(data)
    if slot.fmt in "fd":
        struct.pack_into("<" + slot.fmt, out, slot.offset, float(value))
    else:
        bits = 8 * slot.size
        raw = int(value) % (1 << bits)  # two's complement for the signed formats
        struct.pack_into("<" + slot.fmt.upper() if slot.fmt != "?" else "<B", out, slot.offset, raw)
    return out


@dataclass
class Layout:
    slots: list[Slot]
    header_end: int  # the byte after the last tensor entry (the data section starts at the next alignment)


class _Walk:
    def __init__(self, data: bytes, strings_per_array: int) -> None:
        self.data, self.pos, self.slots = data, 0, []
        self.strings_per_array = strings_per_array  # NOTE: slots for the first few strings of a vocabulary only

    def take(self, fmt: str, kind: str | None = None, label: str = "") -> int | float:
        if kind is not None:
            self.slots.append(Slot(self.pos, fmt, kind, label))
        value: int | float = struct.unpack_from("<" + fmt, self.data, self.pos)[0]
        self.pos += struct.calcsize("<" + fmt)
        return value

    def string(self, label: str, with_slot: bool = True) -> str:
        length = int(self.take("Q", "length" if with_slot else None, f"{label} length"))
        text = self.data[self.pos : self.pos + length].decode("utf-8")
        self.pos += length
        return text

    def value(self, value_type: GGUFValueType, label: str) -> None:
        if value_type == GGUFValueType.STRING:
            self.string(label)
        elif value_type != GGUFValueType.ARRAY:
            self.take(_SCALARS[value_type], "value", label)
        else:
            element = GGUFValueType(int(self.take("I", "type", f"{label} element type")))
            count = int(self.take("Q", "count", f"{label} count"))
            for i in range(count):
                if element == GGUFValueType.STRING:
                    self.string(f"{label}[{i}]", with_slot=i < self.strings_per_array)
                elif element in _SCALARS:
                    fmt = _SCALARS[element]
                    if i < self.strings_per_array:
                        self.take(fmt, "value", f"{label}[{i}]")
                    else:  # NOTE: the rest of a scalar array at once
                        self.pos += struct.calcsize("<" + fmt) * (count - i)
                        break
                else:
                    self.value(element, f"{label}[{i}]")


def header_layout(path: Path, strings_per_array: int = 4) -> Layout:
    """Every number of the header of the GGUF file at `path` (only the first `strings_per_array` elements of an
    array get slots of their own)."""
    with path.open("rb") as f:
        head = f.read(64 << 20)  # NOTE: headers are 1-20 MB (a vocabulary and its merges); tensor data is not read
    walk = _Walk(head, strings_per_array)
    walk.take("I")  # magic
    walk.take("I", "value", "version")
    tensor_count = int(walk.take("Q", "count", "tensor_count"))
    kv_count = int(walk.take("Q", "count", "kv_count"))
    for _ in range(kv_count):
        key = walk.string("key")
        value_type = GGUFValueType(int(walk.take("I", "type", f"{key} type")))
        walk.value(value_type, key)
    for _ in range(tensor_count):
        name = walk.string("tensor name")
        n_dims = int(walk.take("I", "count", f"{name} n_dims"))
        for d in range(n_dims):
            walk.take("Q", "dim", f"{name} dim {d}")
        walk.take("I", "type", f"{name} ggml type")
        walk.take("Q", "offset", f"{name} offset")
    return Layout(walk.slots, walk.pos)


def header_slots(path: Path, strings_per_array: int = 4) -> list[Slot]:
    return header_layout(path, strings_per_array).slots


def slot(path: Path, label: str) -> Slot:
    """The slot whose label is `label` (e.g. "llama.block_count")."""
    found = [s for s in header_slots(path) if s.label == label]
    if len(found) != 1:
        raise KeyError(label)
    return found[0]


def rewritten(
    src: Path,
    dst: Path,
    fields: Mapping[str, tuple[Any, GGUFValueType, GGUFValueType | None]] | None = None,
    drop: tuple[str, ...] = (),
) -> Path:
    """A copy of the GGUF file `src` at `dst` with `fields` set (key -> value, type, element type of an array),
    the keys of `drop` left out, and every tensor as it was. For tiny files: `gguf.GGUFReader` reads it all."""
    from gguf import GGUFReader, GGUFWriter

    reader = GGUFReader(src)
    arch = str(reader.fields["general.architecture"].contents())
    writer = GGUFWriter(dst, arch)
    changes = dict(fields or {})
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in drop:
            continue
        if key in changes:
            value, value_type, sub_type = changes.pop(key)
        else:
            value_type = field.types[0]
            sub_type = field.types[-1] if value_type == GGUFValueType.ARRAY else None
            value = field.contents()
        writer.add_key_value(key, value, value_type, sub_type)
    for key, (value, value_type, sub_type) in changes.items():  # new keys
        writer.add_key_value(key, value, value_type, sub_type)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, tensor.data, raw_shape=tensor.data.shape, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst
