"""read_gguf_metadata: every field as `gguf.GGUFReader` reads it, without building a reader; bad files name the file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFEndian, GGUFReader, GGUFValueType, GGUFWriter

from infer.engine.gguf.metadata import GGUFMetadataError, read_gguf_metadata

FIELDS = [
    ("u8", 200, GGUFValueType.UINT8, None),
    ("i8", -100, GGUFValueType.INT8, None),
    ("u16", 60000, GGUFValueType.UINT16, None),
    ("i16", -30000, GGUFValueType.INT16, None),
    ("u32", 4_000_000_000, GGUFValueType.UINT32, None),
    ("i32", -2_000_000_000, GGUFValueType.INT32, None),
    ("u64", 2**63 + 5, GGUFValueType.UINT64, None),
    ("i64", -(2**62), GGUFValueType.INT64, None),
    ("f32", 1e-5, GGUFValueType.FLOAT32, None),
    ("f64", 1e-300, GGUFValueType.FLOAT64, None),
    ("flag", True, GGUFValueType.BOOL, None),
    ("text", "Grüße 日本 🙂\n", GGUFValueType.STRING, None),
    ("empty", "", GGUFValueType.STRING, None),
    ("tokens", ["<s>", "▁the", "  ", "🙂", ""], GGUFValueType.ARRAY, GGUFValueType.STRING),
    ("types", [1, 3, 4, 6], GGUFValueType.ARRAY, GGUFValueType.INT32),
    ("scores", [0.0, -1.5, -1000.0], GGUFValueType.ARRAY, GGUFValueType.FLOAT32),
    ("flags", [True, False], GGUFValueType.ARRAY, GGUFValueType.BOOL),
    ("sections", [24, 20, 20, 0], GGUFValueType.ARRAY, GGUFValueType.UINT64),
]


@pytest.fixture(scope="module", params=[GGUFEndian.LITTLE, GGUFEndian.BIG], ids=["little", "big"])
def gguf_file(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gguf_metadata") / "fields.gguf"
    writer = GGUFWriter(path, "llama", endianess=request.param)
    for key, value, value_type, sub_type in FIELDS:
        writer.add_key_value(f"test.{key}", value, value_type, sub_type)
    writer.add_tensor("output_norm.weight", np.ones(4, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_fields_equal_gguf_readers(gguf_file: Path) -> None:
    reader = GGUFReader(gguf_file)
    expected = {key: field.contents() for key, field in reader.fields.items() if not key.startswith("GGUF.")}
    meta = read_gguf_metadata(gguf_file)
    assert meta == expected
    assert list(meta) == list(expected)  # in file order
    assert read_gguf_metadata(gguf_file, reader) == expected  # a caller's reader is read, not a second walk


def test_values_are_plain_python(gguf_file: Path) -> None:
    meta = read_gguf_metadata(gguf_file)
    assert meta["general.architecture"] == "llama"
    assert not any(key.startswith("GGUF.") for key in meta)
    assert meta["test.flag"] is True
    assert meta["test.flags"] == [True, False]
    assert meta["test.u64"] == 2**63 + 5
    assert meta["test.f32"] == pytest.approx(1e-5)
    assert meta["test.tokens"] == ["<s>", "▁the", "  ", "🙂", ""]


def test_not_a_gguf_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04" + bytes(64))
    with pytest.raises(GGUFMetadataError, match="not a GGUF file") as err:
        read_gguf_metadata(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("keep_bytes", [10, 30, 200])
def test_truncated_file_names_the_file(gguf_file: Path, tmp_path: Path, keep_bytes: int) -> None:
    path = tmp_path / "truncated.gguf"
    path.write_bytes(gguf_file.read_bytes()[:keep_bytes])
    with pytest.raises(GGUFMetadataError) as err:
        read_gguf_metadata(path)
    assert str(path) in str(err.value)
    assert isinstance(err.value, ValueError)


def test_a_string_array_cut_short_names_the_file(gguf_file: Path, tmp_path: Path) -> None:
    data = gguf_file.read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[: data.index("▁the".encode()) + 2])  # inside the vocabulary's second string
    with pytest.raises(GGUFMetadataError, match="truncated") as err:
        read_gguf_metadata(path)
    assert str(path) in str(err.value)
