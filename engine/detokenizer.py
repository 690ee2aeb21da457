"""Incremental detokenization for streaming: token ids in, text that is safe to show out.

Each `push` decodes only a small window of recent tokens (the prefix-offset / read-offset technique): the
window's first `read_offset` ids are the tokens of the last emitted text, the rest are new; the new text is
`decode(window)` minus `decode(window[:read_offset])`. Once emitted, the new ids become the window's prefix.
Decoding with a prefix rather than one token at a time keeps tokenizers that treat the start of a string
specially (SentencePiece's leading space) right, and lets byte-level tokens join into whole characters. The
first window starts with the last few prompt tokens for the same reason.

Text is held back while:
- it ends in U+FFFD, i.e. the last tokens are an incomplete UTF-8 sequence that later tokens may complete;
- its end could still grow into a stop string (a suffix that is a prefix of some stop string).

When a stop string appears, the text is cut before it, `stopped_on` names it and later pushes return "".
`flush()` releases everything held back when a request ends otherwise (max tokens, EOS). A truly incomplete
UTF-8 sequence is released as U+FFFD, exactly as `decode(all_ids)` shows it, so that without stop strings
the outputs of all `push` calls plus `flush` always add up to `tokenizer.decode(generated_ids)`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

REPLACEMENT_CHAR = "\ufffd"
CONTEXT_TOKENS = 5  # prompt tokens decoded ahead of the first generated token


class Decoder(Protocol):
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    """Turns one request's generated token ids into a stream of text deltas."""

    def __init__(
        self,
        tokenizer: Decoder,
        prompt_token_ids: Sequence[int] = (),
        skip_special_tokens: bool = True,
        stop: Sequence[str] = (),
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._stops = tuple(s for s in stop if s)
        # window of recent ids: ids[:read_offset] is already-emitted text (prompt context at first)
        self._ids: list[int] = list(prompt_token_ids[max(0, len(prompt_token_ids) - CONTEXT_TOKENS) :])
        self._prefix_text = self._decode(self._ids)
        if self._prefix_text.endswith(REPLACEMENT_CHAR):  # context cut inside a character: do without
            self._ids, self._prefix_text = [], ""
        self._read_offset = len(self._ids)
        self._pending = ""  # decoded text held back as a possible stop-string start
        self._emitted: list[str] = []
        self._finished = False
        self.stopped_on: str | None = None

    @property
    def text(self) -> str:
        """Everything emitted so far by `push` and `flush`."""
        return "".join(self._emitted)

    @property
    def finished(self) -> bool:
        """True after a stop string or `flush`; later pushes return ""."""
        return self._finished

    def push(self, token_ids: Sequence[int]) -> str:
        """Add generated tokens; return the text that became safe to emit (maybe "")."""
        if self._finished or not token_ids:
            return ""
        self._ids.extend(token_ids)
        return self._accept(self._decode_new(), final=False)

    def flush(self) -> str:
        """End of request: return all text still held back (incomplete UTF-8 comes out as U+FFFD)."""
        if self._finished:
            return ""
        tail = self._decode_new(final=True)
        text = self._accept(tail, final=True)
        self._finished = True
        return text

    # --- decoding window

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special)

    def _decode_new(self, final: bool = False) -> str:
        """Text of the tokens after read_offset, "" while it may end inside a UTF-8 sequence."""
        if self._read_offset == len(self._ids):
            return ""
        window_text = self._decode(self._ids)
        if len(window_text) <= len(self._prefix_text) and not final:
            return ""  # e.g. skipped special tokens: nothing new yet
        if window_text.endswith(REPLACEMENT_CHAR) and not final:
            return ""  # incomplete character: wait for the next tokens
        new_text = window_text[len(self._prefix_text) :]
        # slide the window: the tokens just read become the prefix
        del self._ids[: self._read_offset]
        self._read_offset = len(self._ids)
        self._prefix_text = self._decode(self._ids)
        return new_text

    # --- stop strings

    def _accept(self, new_text: str, final: bool) -> str:
        """Append decoded text; return the part that can be emitted now."""
        pending = self._pending + new_text
        if stop_hit := self._find_stop(pending):
            start, stop = stop_hit
            self.stopped_on, self._finished, self._pending = stop, True, ""
            return self._emit(pending[:start])
        held = 0 if final else self._stop_prefix_len(pending)
        self._pending = pending[len(pending) - held :] if held else ""
        return self._emit(pending[: len(pending) - held])

    def _emit(self, text: str) -> str:
        if text:
            self._emitted.append(text)
        return text

    def _find_stop(self, text: str) -> tuple[int, str] | None:
        """The stop string that starts first in `text` (the shortest on a tie) and its index."""
        hits = [(idx, len(s), s) for s in self._stops if (idx := text.find(s)) >= 0]
        if not hits:
            return None
        idx, _, stop = min(hits)
        return idx, stop

    def _stop_prefix_len(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
        longest = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:n]):
                    longest = n
                    break
        return longest
