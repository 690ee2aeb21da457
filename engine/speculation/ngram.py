"""Prompt lookup: drafts copied from where the sequence's latest n-gram occurred before (no model)."""

from __future__ import annotations

from array import array
from collections.abc import Sequence


class NgramProposer:
    """Prompt lookup: the tokens after the latest earlier occurrence of the longest suffix n-gram (n from
    max_n down to min_n) within the last window_tokens tokens."""

    def __init__(self, min_n: int = 1, max_n: int = 4, window_tokens: int = 4096) -> None:
        assert 1 <= min_n <= max_n and window_tokens > max_n
        self.min_n, self.max_n, self.window_tokens = min_n, max_n, window_tokens

    def propose(self, token_ids: Sequence[int], max_tokens: int) -> list[int]:
        start = max(0, len(token_ids) - self.window_tokens)
        window = token_ids[start:]
        if max_tokens <= 0 or len(window) < 2:
            return []
        data = array("i", window).tobytes()  # NOTE: bytes.rfind is a C search; matches must be 4-aligned
        for n in range(min(self.max_n, len(window) - 1), self.min_n - 1, -1):
            # an earlier occurrence ends before the last token, so at least one token follows it
            end = _rfind_aligned(data, data[-4 * n :], len(data) - 4)
            if end >= 0:
                return list(window[end : end + max_tokens])
        return []


def _rfind_aligned(data: bytes, pattern: bytes, end_bytes: int) -> int:
    """The token index just past the latest 4-aligned occurrence of pattern within data[:end_bytes], or -1."""
    while True:
        pos = data.rfind(pattern, 0, end_bytes)
        if pos < 0:
            return -1
        if pos % 4 == 0:
            return (pos + len(pattern)) // 4
        end_bytes = pos + len(pattern) - 1
