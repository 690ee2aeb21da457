"""The header walk trusts no count: each count, length, dimension and offset that the file cannot hold is an
error naming the field (or tensor) and the file, found before anything of that size is allocated."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from gguf import GGUFValueType

from infer.engine.gguf import metadata
from infer.engine.gguf.metadata import GGUFMetadataError, read_gguf_header
from infer.engine.gguf.source import GGUFSourceError, open_gguf
from tests.helpers.gguf_layout import header_slots, patched, rewritten, slot
from tests.helpers.tiny_gguf import write_tiny_gguf


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("bounds") / "tiny.gguf", "llama")


def _lie(tiny: Path, tmp_path: Path, label: str, value: int) -> Path:
    """A copy of `tiny` with `value` in the first number labelled `label`."""
    first = next(s for s in header_slots(tiny) if s.label == label)
    out = tmp_path / "lie.gguf"
    out.write_bytes(patched(tiny.read_bytes(), first, value))
    return out


def _refused(path: Path, match: str) -> str:
    start = time.perf_counter()
    with pytest.raises((GGUFMetadataError, GGUFSourceError), match=match) as err:
        open_gguf(path)
    assert time.perf_counter() - start < 0.5
    assert str(path) in str(err.value) and "\n" not in str(err.value)
    return str(err.value)


@pytest.mark.parametrize("label", ["tensor_count", "kv_count"])
@pytest.mark.parametrize("value", [10**6, 2**63])
def test_header_counts_past_the_file_are_refused(tiny: Path, tmp_path: Path, label: str, value: int) -> None:
    _refused(_lie(tiny, tmp_path, label, value), "header counts")


@pytest.mark.parametrize("value", [10**9, 2**40])
def test_an_array_longer_than_the_file_names_its_key(tiny: Path, tmp_path: Path, value: int) -> None:
    _refused(_lie(tiny, tmp_path, "tokenizer.ggml.token_type count", value), "tokenizer.ggml.token_type")


def test_a_vocabulary_longer_than_the_file_names_its_key(tiny: Path, tmp_path: Path) -> None:
    _refused(_lie(tiny, tmp_path, "tokenizer.ggml.tokens count", 2**33), "'tokenizer.ggml.tokens'.*truncated")


@pytest.mark.parametrize("past_the_end", [1, 2**62])
def test_a_string_longer_than_the_file_names_its_key(tiny: Path, tmp_path: Path, past_the_end: int) -> None:
    length = tiny.stat().st_size + past_the_end  # NOTE: 1: within MAX_STRING_BYTES, past the file alone
    _refused(_lie(tiny, tmp_path, "tokenizer.ggml.model length", length), "'tokenizer.ggml.model'.*runs past the end")


def test_a_tensor_count_within_the_bounds_but_past_the_file_is_refused(tiny: Path, tmp_path: Path) -> None:
    _refused(_lie(tiny, tmp_path, "tensor_count", 60_000), "header counts .* need more than")


def test_a_key_longer_than_the_file_names_its_place(tiny: Path, tmp_path: Path) -> None:
    first_key = next(s for s in header_slots(tiny) if s.label == "key length")
    out = tmp_path / "key.gguf"
    out.write_bytes(patched(tiny.read_bytes(), first_key, 2**60))
    _refused(out, "key of field #0")


def test_too_many_dimensions_name_the_tensor(tiny: Path, tmp_path: Path) -> None:
    _refused(_lie(tiny, tmp_path, "output_norm.weight n_dims", 9), "'output_norm.weight'.*9 dimensions")


@pytest.mark.parametrize("label", ["token_embd.weight dim 1", "token_embd.weight offset"])
def test_a_tensor_past_the_end_is_named(tiny: Path, tmp_path: Path, label: str) -> None:
    _refused(_lie(tiny, tmp_path, label, 2**40), "'token_embd.weight' runs past the end")


def test_a_row_of_partial_blocks_is_named(tiny: Path, tmp_path: Path) -> None:
    _refused(_lie(tiny, tmp_path, "token_embd.weight dim 0", 255), "'token_embd.weight' has rows of 255")


@pytest.mark.parametrize("alignment", [0, 3, 2**31])
def test_an_alignment_not_a_power_of_two_is_refused(tiny: Path, tmp_path: Path, alignment: int) -> None:
    path = rewritten(tiny, tmp_path / "a.gguf", {"general.alignment": (alignment, GGUFValueType.UINT32, None)})
    _refused(path, "general.alignment")


def test_a_field_given_twice_is_named(tiny: Path, tmp_path: Path) -> None:
    slots = header_slots(tiny)
    at = next(i for i, s in enumerate(slots) if s.label == "llama.block_count")
    first, value = slots[at - 2], slots[at]  # its key's length, then its type, then its value
    data = tiny.read_bytes()
    field = data[first.offset : value.offset + value.size]
    twice = data[: value.offset + value.size] + field + data[value.offset + value.size :]
    kv_count = slot(tiny, "kv_count")
    out = tmp_path / "twice.gguf"
    out.write_bytes(patched(twice, kv_count, int(kv_count.read(data)) + 1))
    _refused(out, "'llama.block_count' comes twice")


def test_arrays_nested_too_deep_are_refused(tiny: Path, tmp_path: Path) -> None:
    nested = [[[[1]]]]
    path = rewritten(tiny, tmp_path / "n.gguf", {"test.nested": (nested, GGUFValueType.ARRAY, GGUFValueType.ARRAY)})
    _refused(path, "'test.nested'.*nested")


def test_the_metadata_values_are_bounded_in_all(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metadata, "MAX_METADATA_ELEMENTS", 300)  # the vocabulary (256) and its types (256)
    with pytest.raises(GGUFMetadataError, match="more than 300 array values"):
        read_gguf_header(tiny)


def test_a_large_file_is_validated_from_its_header_alone(tiny: Path, tmp_path: Path) -> None:
    big = tmp_path / "big.gguf"
    big.write_bytes(tiny.read_bytes())
    with big.open("r+b") as f:
        f.truncate(1 << 30)  # NOTE: sparse: 1 GiB that takes no disk
    start = time.perf_counter()
    source = open_gguf(big)
    assert time.perf_counter() - start < 1.0
    assert len(source.tensors) == len(open_gguf(tiny).tensors)


@pytest.mark.parametrize("type_name", ["I32", "F64"])
def test_a_tensor_type_that_cannot_be_read_is_named(tiny: Path, tmp_path: Path, type_name: str) -> None:
    from gguf import GGMLQuantizationType

    # NOTE: was a NotImplementedError traceback from gguf.quants while the weights were filled
    path = _lie(tiny, tmp_path, "output_norm.weight ggml type", GGMLQuantizationType[type_name])
    _refused(path, f"'output_norm.weight' is of ggml type {type_name}, which infer cannot read")


def _sparse(tiny: Path, tmp_path: Path, label: str, value: int, size: int = 64 << 20) -> Path:
    out = _lie(tiny, tmp_path, label, value)
    with out.open("r+b") as f:
        f.truncate(size)  # NOTE: sparse: room for the lie inside the file, no disk
    return out


@pytest.mark.parametrize(
    ("label", "match"),
    [
        ("tokenizer.ggml.model length", "'tokenizer.ggml.model'.*a string of 41943040 bytes"),
        ("tokenizer.ggml.tokens[1] length", "'tokenizer.ggml.tokens'.*a string of 41943040 bytes"),
        ("tensor name length", "name of tensor #0 .*a string of 41943040 bytes"),
    ],
)
def test_a_string_that_runs_on_inside_the_file_is_refused_unread(
    tiny: Path, tmp_path: Path, label: str, match: str
) -> None:
    import tracemalloc

    # NOTE: was a copy and a decode of everything up to the length (2x a 1 GB file, found by the fuzzer)
    path = _sparse(tiny, tmp_path, label, 40 << 20)
    tracemalloc.start()
    try:
        _refused(path, match)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20


def test_a_tensor_named_twice_among_the_most_a_header_may_hold_is_refused_at_once(
    tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """65,536 tensor entries (the header's bound), one name twice: a search of every name for its twin took 79 s."""
    names = [f"t{i}" for i in range(65_535)] + ["t7"]
    infos = [type("Info", (), {"name": name})() for name in names]
    monkeypatch.setattr(metadata, "read_gguf_header", lambda path: ({}, infos, 0))
    outcome: list[BaseException] = []
    worker = threading.Thread(target=lambda: outcome.extend(_raised(lambda: open_gguf(tiny))), daemon=True)
    worker.start()
    worker.join(10.0)
    assert outcome and isinstance(outcome[0], GGUFSourceError) and "'t7' comes twice" in str(outcome[0])


def _raised(call: Callable[[], object]) -> list[BaseException]:
    try:
        call()
    except BaseException as e:
        return [e]
    return []
