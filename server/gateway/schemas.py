"""OpenAI request bodies: known fields strictly typed (HTTP 422 otherwise); unknown fields ignored.

OpenAI's SDKs and clients send fields this server has no use for (`store`, `metadata`, `service_tier`, the
nulls of a replayed assistant message, ...): they are accepted, logged once per name (`IgnoredFieldLog`, a
bounded set) and ignored.

Value ranges of the sampling parameters are the model server's to check (it names the field);
here: types, the gateway's own limits (`n`), and the OpenAI features this gateway does not have.
Structured output and tools: `structured.py`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Annotated, Any, Literal, cast

from pydantic import BaseModel, Field, model_validator
from pydantic_core import PydanticCustomError

from infer.api import ChatRole
from infer.server.gateway.errors import unsupported
from infer.server.gateway.strict import Strict
from infer.server.gateway.structured import Guided, NamedToolChoice, ToolCall, ToolChoice, ToolDef

logger = logging.getLogger(__name__)

MAX_CHOICES = 128  # n × prompts of one request: each is one gRPC stream
MAX_LOGPROBS = 20
MAX_LOGGED_FIELDS = 256  # unknown field names remembered, each logged once; later new names are not logged
MAX_FIELD_NAME_CHARS = 64  # a longer name is logged and remembered cut to this
NUM_NAMES_PER_LINE = 16  # one log line per request names at most this many new fields

Int32 = Annotated[int, Field(ge=-(2**31), lt=2**31)]
Seed = Annotated[int, Field(ge=0, lt=2**63)]
TokenIds = Annotated[list[Annotated[int, Field(ge=0, lt=2**31)]], Field(min_length=1)]


def ignored_fields(model: BaseModel, prefix: str = "") -> list[str]:
    """The unknown fields of a parsed body, as paths (`store`, `messages[].refusal`)."""
    found = [prefix + name for name in model.model_extra or {}]
    for name in type(model).model_fields:
        value = getattr(model, name)
        items = value if isinstance(value, list) else [value]
        for item in items:
            if isinstance(item, BaseModel):
                found += ignored_fields(item, f"{prefix}{name}{'[]' if isinstance(value, list) else ''}.")
    return sorted(set(found))


class IgnoredFieldLog:
    """Logs each unknown field name once, at most one INFO line per request; remembers at most `capacity` names.

    NOTE: names are the client's to choose: a body with 50,000 unique keys must not give 50,000 log lines,
    nor a set that grows for ever. A line lists up to NUM_NAMES_PER_LINE new names (the rest wait for a
    later request); once `capacity` names are remembered, new ones go unlogged (said once, in a WARNING).
    """

    def __init__(self, capacity: int = MAX_LOGGED_FIELDS) -> None:
        self.capacity = capacity
        self.names: set[str] = set()
        self.is_full = False

    def log(self, path: str, names: Iterable[str]) -> None:
        new = [name for name in dict.fromkeys(map(_shorten, names)) if name not in self.names]
        if not new:
            return
        room = self.capacity - len(self.names)
        if room <= 0:
            if not self.is_full:
                self.is_full = True
                logger.warning(
                    "%d unknown field names logged: new ones are now ignored without a log line", self.capacity
                )
            return
        listed = new[: min(room, NUM_NAMES_PER_LINE)]
        self.names.update(listed)
        more = f"; {len(new) - len(listed)} more not listed" if len(new) > len(listed) else ""
        shown = ", ".join(repr(name) for name in listed)
        logger.info("%s: ignoring the unknown field(s) %s (each logged once%s)", path, shown, more)


def _shorten(name: str) -> str:
    return name if len(name) <= MAX_FIELD_NAME_CHARS else name[:MAX_FIELD_NAME_CHARS] + "…"


class StreamOptions(Strict):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None  # accepted; this gateway never pads chunks


class Sampling(Guided):
    """Fields shared by both endpoints: OpenAI's, then vLLM's extras (the constraint fields: `Guided`)."""

    model: str
    n: Annotated[int, Field(ge=1, le=MAX_CHOICES)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    seed: Seed | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None  # accepted and ignored
    # vLLM-style extras
    top_k: Int32 | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: Int32 | None = None
    ignore_eos: bool = False
    stop_token_ids: list[Int32] | None = None
    skip_special_tokens: bool | None = None
    speculative_tokens: Int32 | None = None  # n-gram speculative decoding: drafts per step (0 = off)
    priority: Int32 | None = None  # lower is sooner, [-20, 20] (vLLM's); under --scheduling-policy priority or fair

    @model_validator(mode="after")
    def _check_common(self) -> Sampling:
        if self.logit_bias:
            raise unsupported("logit_bias", "not supported (only an empty object)")
        if self.stream_options is not None and not self.stream:
            raise unsupported("stream_options", "only allowed when stream is true")
        return self

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or ())


class CompletionRequest(Sampling):
    prompt: str | list[str] | TokenIds | list[TokenIds]
    max_tokens: Int32 | None = 16
    logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    echo: bool = False
    best_of: Int32 | None = None
    suffix: str | None = None

    @model_validator(mode="after")
    def _check_completion(self) -> CompletionRequest:
        if self.echo:
            raise unsupported("echo", "not supported")
        if self.suffix:
            raise unsupported("suffix", "not supported")
        if self.best_of is not None and self.best_of != self.n:
            raise unsupported("best_of", "only best_of = n is supported")
        if self.prompt == []:
            raise unsupported("prompt", "must not be empty")
        if len(self.prompts) * self.n > MAX_CHOICES:
            raise unsupported("n", f"prompts × n must be at most {MAX_CHOICES}")
        return self

    @property
    def prompts(self) -> list[str] | list[list[int]]:
        """One entry per prompt: text, or token ids."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if all(isinstance(x, int) for x in p):
            return [cast(list[int], p)]
        return cast(list[str] | list[list[int]], p)


class TextPart(Strict):
    type: Literal["text"]  # images and audio: not supported
    text: str

    @model_validator(mode="before")
    @classmethod
    def _only_text(cls, data: Any) -> Any:
        kind = data.get("type") if isinstance(data, dict) else None
        if isinstance(kind, str) and kind != "text":
            message = "'{kind}' parts are not supported: this model reads text parts only"
            raise PydanticCustomError("unsupported_value", message, {"kind": kind[:40]})
        return data


class ChatMessage(Strict):
    role: ChatRole
    content: str | list[TextPart] | None = None
    name: str | None = None  # a tool result's function; ignored on the other roles (templates have no place for it)
    tool_calls: list[ToolCall] | None = None  # assistant: the calls it made
    tool_call_id: str | None = None  # tool: the call this result answers

    @property
    def text(self) -> str:
        if isinstance(self.content, list):
            return "\n".join(part.text for part in self.content)
        return self.content or ""


class ChatCompletionRequest(Sampling):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Int32 | None = None
    max_completion_tokens: Int32 | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    tools: list[ToolDef] | None = None
    functions: list[dict[str, Any]] | None = None  # the deprecated form of tools
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None

    @model_validator(mode="after")
    def _check_chat(self) -> ChatCompletionRequest:
        if self.functions:
            raise unsupported("functions", "the deprecated functions are not supported: use tools")
        if self.top_logprobs is not None and not self.logprobs:
            raise unsupported("top_logprobs", "needs logprobs: true")
        names = [t.function.name for t in self.tools or ()]
        if self.tool_choice == "required" and not names:
            raise unsupported("tool_choice", "required needs tools")
        if isinstance(self.tool_choice, NamedToolChoice) and self.tool_choice.function.name not in names:
            name = self.tool_choice.function.name[:64]
            raise unsupported("tool_choice", f"the function {name!r} is not one of the tools")
        if self.forces_calls and self.constraint_param is not None:
            raise unsupported(self.constraint_param, "cannot be set when tool_choice forces a tool call")
        return self

    @property
    def forces_calls(self) -> bool:
        """tool_choice required or a named function: the output is constrained to tool calls."""
        return self.tool_choice == "required" or isinstance(self.tool_choice, NamedToolChoice)

    @property
    def max_new_tokens(self) -> int | None:
        """max_completion_tokens, else the deprecated max_tokens; None = up to the context length."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None
