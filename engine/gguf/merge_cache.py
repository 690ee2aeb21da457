"""Merges rebuilt from a SentencePiece vocabulary's scores, kept on disk between starts.

Gemma's 262,144 tokens take ~1.4 s of Python to rebuild into 514,906 merges, a third of that to read back (time
to SERVING). One file per vocabulary in `$XDG_CACHE_HOME/infer/tokenizers`, named by a hash of the tokens, their ids
and scores; the merges are stored as pairs of token ids, behind a SHA-256 of them. A file that does not check out
is rebuilt and written again; a cache that cannot be written is skipped.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import sys
import threading
from array import array
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

# NOTE: its version is part of every key: bump it when the rebuild changes what it returns (old files would hold
# the old merges)
HEADER = f"infer merges 1 {sys.byteorder}\n".encode()  # then a SHA-256 of the body, then int32 id pairs
Merges = list[tuple[str, str]]
Rebuild = Callable[[Mapping[str, int], Mapping[str, float]], Merges]


def cache_dir() -> Path:
    """`$XDG_CACHE_HOME/infer/tokenizers` (XDG_CACHE_HOME defaults to `~/.cache`)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "infer" / "tokenizers"


def cached_merges(ids: Mapping[str, int], scores: Mapping[str, float], rebuild: Rebuild) -> Merges:
    """`rebuild(ids, scores)`, read from the cache when it holds them, else rebuilt and written there."""
    path = cache_dir() / f"{_key(ids, scores)}.merges"
    merges = _read(path, ids)
    if merges is None:
        merges = rebuild(ids, scores)
        _write(path, merges, ids)
    return merges


def _key(ids: Mapping[str, int], scores: Mapping[str, float]) -> str:
    key = hashlib.sha256(HEADER)
    id_names, score_names = list(ids), list(scores)
    id_text = _spelled(id_names)
    score_text = id_text if score_names == id_names else _spelled(score_names)  # NOTE: mostly the same tokens
    for text, numbers in ((id_text, array("q", ids.values())), (score_text, array("d", scores.values()))):
        key.update(text)
        key.update(numbers.tobytes())
    return key.hexdigest()


def _spelled(names: list[str]) -> bytes:
    """The names' lengths, then their text: NOTE: the lengths make the joined text unambiguous."""
    return array("q", map(len, names)).tobytes() + "".join(names).encode("utf-8", "surrogatepass")


def _read(path: Path, ids: Mapping[str, int]) -> Merges | None:
    """The merges in `path`; None when it is missing, damaged or not of this vocabulary."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    start = len(HEADER) + hashlib.sha256().digest_size
    body = data[start:]
    if data[: len(HEADER)] != HEADER or hashlib.sha256(body).digest() != data[len(HEADER) : start] or len(body) % 8:
        return None
    index = np.frombuffer(body, dtype=np.int32)
    token_ids = np.fromiter(ids.values(), dtype=np.int64, count=len(ids))
    spelling = np.full(int(token_ids.max(initial=-1)) + 1, None, dtype=object)  # id -> token
    spelling[token_ids] = np.array(list(ids), dtype=object)
    is_token = np.zeros(spelling.size, dtype=bool)
    is_token[token_ids] = True
    if index.size and (index.min() < 0 or index.max() >= spelling.size or not is_token[index].all()):
        return None
    names = spelling[index].tolist()  # NOTE: numpy picks them, several times faster than a loop over 1M ids
    return list(zip(names[0::2], names[1::2], strict=True))


def _write(path: Path, merges: Merges, ids: Mapping[str, int]) -> None:
    body = np.array([ids[t] for pair in merges for t in pair], dtype=np.int32).tobytes()
    temp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temp.write_bytes(HEADER + hashlib.sha256(body).digest() + body)
        os.replace(temp, path)  # NOTE: whole or not at all, for a server starting beside this one
    except OSError as e:
        logger.debug("merges not cached in %s: %s", path.parent, e)
        with contextlib.suppress(OSError):
            temp.unlink()
