"""Tool calls out of a streamed output: text in, content and call deltas out.

`feed` takes each new piece of text and returns what may be shown now: content (text that cannot be part
of a call, held back while it might be), and the calls completed so far. `finish` returns the rest. A call
that does not parse stays content, as the model wrote it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class ToolCallDelta:
    """A call's first delta carries its index, id and name; later ones more of its arguments (JSON text)."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass(frozen=True)
class Parsed:
    content: str = ""
    calls: list[ToolCallDelta] = field(default_factory=list)


class ToolCallParser(Protocol):
    def feed(self, text: str) -> Parsed: ...

    def finish(self) -> Parsed: ...

    @property
    def has_calls(self) -> bool: ...


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _arguments(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def parse_calls(text: str, arguments_keys: Sequence[str] = ("arguments", "parameters")) -> list[tuple[str, str]] | None:
    """(name, arguments JSON) of each call in `text`, a JSON object or list of objects; None if it is not that."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    items = value if isinstance(value, list) else [value]
    calls: list[tuple[str, str]] = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return None
        arguments: Any = next((item[k] for k in arguments_keys if k in item), {})
        calls.append((item["name"], _arguments(arguments)))
    return calls or None


class _Calls:
    """Numbering and whitespace: content that is only whitespace waits for what comes next, and is dropped
    once the output has calls (the newlines around them are not an answer)."""

    def __init__(self) -> None:
        self.num_calls = 0
        self._blank = ""

    @property
    def has_calls(self) -> bool:
        return self.num_calls > 0

    def deltas(self, calls: Sequence[tuple[str, str]]) -> list[ToolCallDelta]:
        out = [ToolCallDelta(self.num_calls + i, new_call_id(), name, args) for i, (name, args) in enumerate(calls)]
        self.num_calls += len(out)
        self._blank = ""
        return out

    def content(self, text: str, is_last: bool = False) -> str:
        text = self._blank + text
        body = text.rstrip()
        self._blank = text[len(body) :]
        if is_last and not self.has_calls:
            body, self._blank = body + self._blank, ""
        return body


class TaggedParser(_Calls):
    """`<tool_call>...</tool_call>` blocks, each a JSON call or a list of calls (hermes, json_list)."""

    def __init__(self) -> None:
        super().__init__()
        self._buffer, self._in_call = "", False

    def feed(self, text: str) -> Parsed:
        self._buffer += text
        shown, calls = "", []
        while True:
            if not self._in_call:
                start = self._buffer.find(TOOL_CALL_OPEN)
                if start < 0:  # keep what may be the start of a tag
                    cut = len(self._buffer) - _partial_suffix(self._buffer, TOOL_CALL_OPEN)
                    shown += self.content(self._buffer[:cut])
                    self._buffer = self._buffer[cut:]
                    break
                shown += self.content(self._buffer[:start])
                self._buffer, self._in_call = self._buffer[start + len(TOOL_CALL_OPEN) :], True
                continue
            end = self._buffer.find(TOOL_CALL_CLOSE)
            if end < 0:
                break
            body, self._buffer = self._buffer[:end], self._buffer[end + len(TOOL_CALL_CLOSE) :]
            self._in_call = False
            parsed = parse_calls(body.strip())
            if parsed is None:
                shown += self.content(TOOL_CALL_OPEN + body + TOOL_CALL_CLOSE)
            else:
                calls += self.deltas(parsed)
        return Parsed(shown, calls)

    def finish(self) -> Parsed:
        rest, self._buffer = self._buffer, ""
        if not self._in_call:
            return Parsed(self.content(rest, is_last=True))
        self._in_call = False  # a call cut off by eos or max_tokens: a call if it parses, else text
        parsed = parse_calls(rest.strip())
        if parsed is None:
            return Parsed(self.content(TOOL_CALL_OPEN + rest, is_last=True))
        return Parsed("", self.deltas(parsed))


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of `text` that begins `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class WholeOutputParser(_Calls):
    """Llama 3: a call is the whole output, one JSON object (or several separated by ';'). An output that
    starts with anything else than '{' is content and streams as it comes."""

    def __init__(self) -> None:
        super().__init__()
        self._buffer = ""
        self._is_json: bool | None = None  # decided by the first character that is not whitespace

    def feed(self, text: str) -> Parsed:
        self._buffer += text
        if self._is_json is None and self._buffer.strip():
            self._is_json = self._buffer.lstrip().startswith("{")
        if self._is_json is not False:
            return Parsed()
        out, self._buffer = self._buffer, ""
        return Parsed(self.content(out))

    def finish(self) -> Parsed:
        rest, self._buffer = self._buffer, ""
        if self._is_json is True:
            calls = [parse_calls(part) for part in rest.split(";") if part.strip()]
            if calls and all(c is not None for c in calls):
                return Parsed("", self.deltas([call for c in calls if c for call in c]))
        return Parsed(self.content(rest, is_last=True))


class NamedParser(_Calls):
    """tool_choice names a function: the output is its arguments, streamed as they come."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def feed(self, text: str) -> Parsed:
        if not text:
            return Parsed()
        if not self.has_calls:
            return Parsed("", self.deltas([(self.name, text)]))
        return Parsed("", [ToolCallDelta(0, arguments=text)])

    def finish(self) -> Parsed:
        return Parsed() if self.has_calls else Parsed("", self.deltas([(self.name, "{}")]))


class ListParser(_Calls):
    """tool_choice required: the output is a JSON list of calls, parsed when it is complete."""

    def __init__(self) -> None:
        super().__init__()
        self._buffer = ""

    def feed(self, text: str) -> Parsed:
        self._buffer += text
        return Parsed()

    def finish(self) -> Parsed:
        parsed = parse_calls(self._buffer)
        return Parsed("", self.deltas(parsed)) if parsed else Parsed(self.content(self._buffer, is_last=True))
