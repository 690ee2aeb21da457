"""A GGUF load's memory (issue 26, peak RSS): no page of the file left mapped into the process once the model is
filled, the largest weights packed first (while the model is not yet resident), and the file's metadata (a
vocabulary's Python lists) gone before the KV cache is allocated."""

from __future__ import annotations

import re
import weakref
from pathlib import Path
from typing import Any

import pytest

from infer.engine import loader
from infer.engine.config import EngineConfig
from infer.engine.gguf import weights
from infer.engine.gguf.source import GGUFSource, open_gguf
from tests.helpers.tiny_gguf import write_tiny_gguf

CONFIG = EngineConfig(max_model_len=64, num_blocks=8, block_size=16)


def _resident_kib(path: Path) -> int:
    """Resident KiB of this process's mappings of `path` (/proc/self/smaps)."""
    total, in_file = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if re.match(r"[0-9a-f]+-[0-9a-f]+$", fields[0]):  # a mapping's first line: range, perms, offset, dev, inode
            in_file = fields[5:] == [str(path)]
        elif in_file and fields[0] == "Rss:":
            total += int(fields[1])
    return total


def test_no_page_of_the_file_stays_mapped_once_the_model_is_filled(tmp_path: Path) -> None:
    """Reading one tensor maps its neighbours' cached pages too (fault-around): dropping each tensor's own range
    after it is copied left some of the file resident; the whole map is dropped at the end."""
    path = write_tiny_gguf(tmp_path / "m.gguf", "llama", num_layers=2)
    path.read_bytes()  # in the page cache: what fault-around maps
    source = open_gguf(path)
    source.tensors[0].data.sum()  # a read maps pages: the count sees them
    assert _resident_kib(path) > 0
    loader.load_gguf_model(source, CONFIG)
    assert _resident_kib(path) == 0


def test_the_largest_weights_are_packed_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While a weight is packed its file pages and its packed copy are both resident: the largest (a 262k-token
    embedding) comes first, while the model is not."""
    path = write_tiny_gguf(tmp_path / "m.gguf", "qwen2", num_layers=2, tied=False)
    sizes: list[int] = []
    pack = weights._pack

    def recording(parts: Any, shape: tuple[int, ...]) -> Any:
        sizes.append(sum(p.tensor.data.nbytes for p in parts))
        return pack(parts, shape)

    monkeypatch.setattr(weights, "_pack", recording)
    loader.load_gguf_model(open_gguf(path), CONFIG)
    assert len(sizes) > 2 and sizes == sorted(sizes, reverse=True)


def test_the_files_metadata_is_gone_before_the_kv_cache_is_allocated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The peak of a load is its end, the KV cache allocated beside the model: the file's metadata (Gemma's
    262,144 tokens and scores as Python lists, ~40 MB) and its memory map must be gone by then, and the heap's
    free memory handed back."""
    path = write_tiny_gguf(tmp_path / "m.gguf", "gemma3", num_layers=1)
    sources: list[weakref.ref[GGUFSource]] = []
    events: list[str] = []
    open_source, runner, trim = loader.open_source, loader.ModelRunner, loader._return_freed_memory

    def opening(gguf_file: Path) -> GGUFSource:
        source = open_source(gguf_file)
        sources.append(weakref.ref(source))
        return source

    def building(*args: Any, **kwargs: Any) -> Any:
        events.append("source alive" if sources[0]() is not None else "source gone")
        return runner(*args, **kwargs)

    def trimming() -> None:
        events.append("trim")
        trim()

    monkeypatch.setattr(loader, "open_source", opening)
    monkeypatch.setattr(loader, "ModelRunner", building)
    monkeypatch.setattr(loader, "_return_freed_memory", trimming)
    loader.load_engine(EngineConfig(model=str(path), max_model_len=64, num_blocks=8, block_size=16))
    assert events[-2:] == ["trim", "source gone"]
