"""infer.v1 GenerateResponses -> OpenAI JSON: whole responses, stream chunks, usage and logprobs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from infer.api import FINISH_REASONS, pb

LOGPROB_FLOOR = -9999.0  # NOTE: JSON has no -inf; OpenAI-compatible servers clamp to this
Json = dict[str, Any]


@dataclass(frozen=True)
class Meta:
    """What every object of one response repeats."""

    id: str
    model: str
    created: int
    n: int  # choices per prompt
    include_usage: bool = False
    has_logprobs: bool = False


@dataclass
class Choice:
    """One choice's stream, gathered."""

    index: int
    text: str = ""
    logprobs: list[pb.TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    usage: pb.Usage | None = None
    num_offset_chars: int = 0  # legacy logprobs: text_offset of the next token
    is_started: bool = False  # chat stream: the role chunk went out
    tool_calls: dict[int, list[str]] = field(default_factory=dict)  # index -> [id, name, arguments so far]

    def add(self, response: pb.GenerateResponse) -> None:
        self.text += response.text
        self.logprobs.extend(response.logprobs)
        for delta in response.tool_calls:
            self.tool_calls.setdefault(delta.index, [delta.id, delta.name, ""])[2] += delta.arguments
        if response.finish_reason != pb.FINISH_REASON_UNSPECIFIED:
            self.finish_reason = FINISH_REASONS.get(response.finish_reason, "stop")
        if response.HasField("usage"):
            self.usage = response.usage


def _value(logprob: float) -> float:
    """A logprob JSON can carry: in [LOGPROB_FLOOR, 0]; NaN (an upstream that underflowed) becomes the floor."""
    return LOGPROB_FLOOR if math.isnan(logprob) else min(max(logprob, LOGPROB_FLOOR), 0.0)


def completion_logprobs(logprobs: Sequence[pb.TokenLogprob], offset: int = 0) -> tuple[Json, int]:
    """The legacy format, and the text offset after these tokens."""
    out: Json = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for lp in logprobs:
        out["tokens"].append(lp.token)
        out["token_logprobs"].append(_value(lp.logprob))
        out["top_logprobs"].append({t.token: _value(t.logprob) for t in lp.top})
        out["text_offset"].append(offset)
        offset += len(lp.token)
    return out, offset


def _token(token: str, logprob: float) -> Json:
    return {"token": token, "logprob": _value(logprob), "bytes": list(token.encode("utf-8"))}


def chat_logprobs(logprobs: Sequence[pb.TokenLogprob]) -> Json:
    content = [_token(lp.token, lp.logprob) | {"top_logprobs": [_token(t.token, t.logprob) for t in lp.top]}
               for lp in logprobs]  # fmt: skip
    return {"content": content, "refusal": None}


def usage(choices: Sequence[Choice], n: int) -> Json:
    """Prompt tokens once per prompt (every n-th choice), completion tokens of every choice."""
    firsts = [c.usage for c in choices[::n] if c.usage is not None]
    num_prompt = sum(u.prompt_tokens for u in firsts)
    num_completion = sum(c.usage.completion_tokens for c in choices if c.usage is not None)
    return {
        "prompt_tokens": num_prompt,
        "completion_tokens": num_completion,
        "total_tokens": num_prompt + num_completion,
        "prompt_tokens_details": {"cached_tokens": sum(u.cached_tokens for u in firsts)},
    }


class Format(Protocol):
    """How one endpoint writes its objects."""

    meta: Meta

    def body(self, choices: Sequence[Choice]) -> Json: ...

    def chunks(self, choice: Choice, response: pb.GenerateResponse) -> list[Json]: ...

    def usage_chunk(self, choices: Sequence[Choice]) -> Json: ...


class _Base:
    object = ""
    chunk_object = ""

    def __init__(self, meta: Meta) -> None:
        self.meta = meta

    def _head(self, object: str) -> Json:
        return {"id": self.meta.id, "object": object, "created": self.meta.created, "model": self.meta.model}

    def _chunk(self, choices: list[Json]) -> Json:
        chunk = self._head(self.chunk_object) | {"choices": choices}
        return chunk | {"usage": None} if self.meta.include_usage else chunk

    def _body(self, choices: list[Json], all_choices: Sequence[Choice]) -> Json:
        return self._head(self.object) | {"choices": choices, "usage": usage(all_choices, self.meta.n)}

    def usage_chunk(self, choices: Sequence[Choice]) -> Json:
        return self._head(self.chunk_object) | {"choices": [], "usage": usage(choices, self.meta.n)}


class CompletionFormat(_Base):
    object = chunk_object = "text_completion"

    def _logprobs(self, choice: Choice, logprobs: Sequence[pb.TokenLogprob], offset: int) -> Json | None:
        if not self.meta.has_logprobs:
            return None
        out, choice.num_offset_chars = completion_logprobs(logprobs, offset)
        return out

    def body(self, choices: Sequence[Choice]) -> Json:
        out = [
            {"index": c.index, "text": c.text, "logprobs": self._logprobs(c, c.logprobs, 0),
             "finish_reason": c.finish_reason}
            for c in choices
        ]  # fmt: skip
        return self._body(out, choices)

    def chunks(self, choice: Choice, response: pb.GenerateResponse) -> list[Json]:
        reason = FINISH_REASONS.get(response.finish_reason)
        if not (response.text or response.logprobs or reason):
            return []
        logprobs = self._logprobs(choice, response.logprobs, choice.num_offset_chars)
        return [self._chunk([{"index": choice.index, "text": response.text, "logprobs": logprobs,
                              "finish_reason": reason}])]  # fmt: skip


class ChatFormat(_Base):
    object = "chat.completion"
    chunk_object = "chat.completion.chunk"

    def _logprobs(self, logprobs: Sequence[pb.TokenLogprob]) -> Json | None:
        return chat_logprobs(logprobs) if self.meta.has_logprobs else None

    def body(self, choices: Sequence[Choice]) -> Json:
        out = [
            {"index": c.index, "message": _message(c), "logprobs": self._logprobs(c.logprobs),
             "finish_reason": c.finish_reason}
            for c in choices
        ]  # fmt: skip
        return self._body(out, choices)

    def _delta(self, index: int, delta: Json, logprobs: Json | None = None, reason: str | None = None) -> Json:
        return self._chunk([{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}])

    def chunks(self, choice: Choice, response: pb.GenerateResponse) -> list[Json]:
        """The role first, then content deltas, then the finish reason with an empty delta."""
        out = []
        if not choice.is_started:
            choice.is_started = True
            out.append(self._delta(choice.index, {"role": "assistant", "content": ""}))
        if response.text or response.logprobs:
            out.append(self._delta(choice.index, {"content": response.text}, self._logprobs(response.logprobs)))
        if response.tool_calls:
            out.append(self._delta(choice.index, {"tool_calls": [_call_delta(d) for d in response.tool_calls]}))
        reason = FINISH_REASONS.get(response.finish_reason)
        if reason is not None:
            out.append(self._delta(choice.index, {}, reason=reason))
        return out


def _message(choice: Choice) -> Json:
    """The assistant's message: its text, and its tool calls (content is null when it only called tools)."""
    if not choice.tool_calls:
        return {"role": "assistant", "content": choice.text}
    calls = [{"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
             for call_id, name, arguments in (choice.tool_calls[i] for i in sorted(choice.tool_calls))]  # fmt: skip
    return {"role": "assistant", "content": choice.text or None, "tool_calls": calls}


def _call_delta(delta: pb.ToolCallDelta) -> Json:
    """OpenAI's streamed call: the first delta of a call has its id, type and name, later ones more arguments."""
    if delta.id:
        function = {"name": delta.name, "arguments": delta.arguments}
        return {"index": delta.index, "id": delta.id, "type": "function", "function": function}
    return {"index": delta.index, "function": {"arguments": delta.arguments}}
