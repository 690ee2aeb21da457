"""Merges rebuilt from a SentencePiece vocabulary come back from the cache as they were built; a damaged or
foreign file is rebuilt, a cache that cannot be written is skipped; the tokenizer is the same either way."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from infer.engine.gguf import merge_cache
from infer.engine.gguf.merge_cache import Merges, cached_merges
from infer.engine.gguf.tokenizer import _rebuild_merges, tokenizer_from_gguf
from tests.helpers.gguf_tokenizers import sentencepiece_fields

IDS = {t: i for i, t in enumerate(["a", "b", "ab", "c", "abc", "bc", "▁", "▁a"])}
SCORES = {t: -float(i) for t, i in IDS.items()}


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "tokenizers"
    monkeypatch.setattr(merge_cache, "cache_dir", lambda: folder)
    return folder


class Counted:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, ids: Mapping[str, int], scores: Mapping[str, float]) -> Merges:
        self.calls += 1
        return _rebuild_merges(ids, scores)


def test_merges_come_back_from_the_cache_as_built(cache: Path) -> None:
    rebuild = Counted()
    first = cached_merges(IDS, SCORES, rebuild)
    assert first == _rebuild_merges(IDS, SCORES) and len(first) > 2
    assert cached_merges(IDS, SCORES, rebuild) == first
    assert rebuild.calls == 1 and len(list(cache.glob("*.merges"))) == 1


def test_another_vocabulary_or_score_is_another_file(cache: Path) -> None:
    rebuild = Counted()
    cached_merges(IDS, SCORES, rebuild)
    cached_merges(IDS, {**SCORES, "ab": 5.0}, rebuild)
    cached_merges({**IDS, "ca": 8}, {**SCORES, "ca": -8.0}, rebuild)
    assert rebuild.calls == 3 and len(list(cache.glob("*.merges"))) == 3


@pytest.mark.parametrize("damage", ["truncated", "flipped", "empty", "foreign ids"])
def test_a_damaged_file_is_rebuilt_and_written_again(cache: Path, damage: str) -> None:
    rebuild = Counted()
    expected = cached_merges(IDS, SCORES, rebuild)
    (path,) = cache.glob("*.merges")
    data = path.read_bytes()
    if damage == "foreign ids":  # a well-formed file whose ids this vocabulary lacks
        data = data[: len(merge_cache.HEADER)]
        body = bytes([200, 0, 0, 0]) * 2
        data += merge_cache.hashlib.sha256(body).digest() + body
    damaged = {"truncated": data[:-3], "flipped": data[:-1] + bytes([data[-1] ^ 1]), "empty": b""}.get(damage, data)
    path.write_bytes(damaged)
    assert cached_merges(IDS, SCORES, rebuild) == expected
    assert rebuild.calls == 2
    assert cached_merges(IDS, SCORES, rebuild) == expected and rebuild.calls == 2  # written again


def test_a_cache_that_cannot_be_written_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setattr(merge_cache, "cache_dir", lambda: blocked / "tokenizers")
    rebuild = Counted()
    assert cached_merges(IDS, SCORES, rebuild) == cached_merges(IDS, SCORES, rebuild) == _rebuild_merges(IDS, SCORES)
    assert rebuild.calls == 2


@pytest.mark.parametrize("gemma", [True, False])
def test_the_tokenizer_is_the_same_from_the_cache(cache: Path, gemma: bool) -> None:
    meta: dict[str, Any] = {"general.architecture": "gemma3" if gemma else "llama", **sentencepiece_fields(gemma)}
    built = tokenizer_from_gguf(meta, "tiny.gguf")
    assert len(list(cache.glob("*.merges"))) == 1
    again = tokenizer_from_gguf(meta, "tiny.gguf")
    assert again._backend.to_str() == built._backend.to_str()
    text = "Hello world, the  spaces 日本 🙂"
    assert again.encode(text) == built.encode(text)
