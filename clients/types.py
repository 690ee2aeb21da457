"""Plain client-side types, and their proto conversions. No engine import: gateways use these."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import grpc

from infer.api import CONSTRAINT_FIELDS, FINISH_REASONS, INVALID_FIELD_KEY, ErrorReason, error_reason, pb, retry_after_s

# text, token ids, or chat messages ({"role": ..., "content": ...})
Prompt = str | Sequence[int] | Sequence[Mapping[str, str]]


class InferError(Exception):
    """A failed RPC: `code` is the gRPC status code, `details` the server's message (for people), and from its
    trailing metadata: `reason` why it was refused (`ErrorReason.CONTEXT_LENGTH_EXCEEDED`), `field` the request
    field at fault that an INVALID_ARGUMENT names (`sampling.max_tokens`), if any; `retry_after_s` the seconds to
    wait before a retry would be let in (a spent token budget), if it says."""

    def __init__(
        self,
        code: grpc.StatusCode,
        details: str,
        field: str | None = None,
        reason: ErrorReason | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code, self.details, self.field, self.reason = code, details, field, reason
        self.retry_after_s = retry_after_s

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> InferError:
        trailing = _trailing_metadata(error)
        field, reason = _invalid_field(trailing), error_reason(trailing)
        return cls(error.code(), error.details() or "", field, reason, retry_after_s(trailing))


def _trailing_metadata(error: grpc.RpcError) -> list[tuple[str, str | bytes]]:
    trailing = getattr(error, "trailing_metadata", None)
    return list((trailing() if trailing is not None else None) or ())


def _invalid_field(trailing: list[tuple[str, str | bytes]]) -> str | None:
    for key, value in trailing:
        if key == INVALID_FIELD_KEY and isinstance(value, str):
            return str(value)
    return None


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters; None = the server's default (see the proto for each)."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    min_tokens: int | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    skip_special_tokens: bool | None = None
    speculative_tokens: int | None = None  # n-gram drafts per step (0 = off; None = the server's default)
    priority: int | None = None  # lower is sooner, [-20, 20]; under the server's --scheduling-policy priority or fair
    # constrained decoding: at most one of these (docs/api.md)
    json_schema: str | None = None  # JSON text
    regex: str | None = None
    grammar: str | None = None  # EBNF
    choice: tuple[str, ...] | None = None
    json_object: bool = False

    def __post_init__(self) -> None:
        named = [name for name in CONSTRAINT_FIELDS if getattr(self, name) not in (None, False)]
        if len(named) > 1:
            raise ValueError(f"at most one constraint, not {' and '.join(named)}")

    def to_proto(self) -> pb.SamplingParams:
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("choice", "json_object")}
        params = pb.SamplingParams(**{k: v for k, v in values.items() if v is not None})
        if self.choice is not None:
            params.choice.choices.extend(self.choice)
        if self.json_object:
            params.json_object.SetInParent()
        return params


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    token: str
    logprob: float
    top: tuple[tuple[int, str, float], ...] = ()  # (token id, token, logprob), best first


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass(frozen=True)
class Timings:
    queue_s: float  # arrival to first scheduled
    ttft_s: float  # arrival to first token (server side)
    total_s: float
    num_preemptions: int
    num_draft_tokens: int = 0  # speculative drafts verified
    num_accepted_tokens: int = 0  # of which accepted
    acceptance_rate: float = 0.0  # accepted / verified; 0 without drafts


@dataclass(frozen=True)
class Chunk:
    """One streamed message: new tokens and text; the last one also has finish_reason and usage."""

    request_id: str
    token_ids: tuple[int, ...]
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()
    finish_reason: str | None = None  # "stop" or "length" on the last chunk
    usage: Usage | None = None
    timings: Timings | None = None

    @classmethod
    def from_proto(cls, r: pb.GenerateResponse) -> Chunk:
        logprobs = tuple(
            TokenLogprob(lp.token_id, lp.token, lp.logprob, tuple((t.token_id, t.token, t.logprob) for t in lp.top))
            for lp in r.logprobs
        )
        usage = timings = None
        if r.HasField("usage"):
            usage = Usage(r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.cached_tokens)
        if r.HasField("timings"):
            t = r.timings
            timings = Timings(t.queue_s, t.ttft_s, t.total_s, t.num_preemptions, t.num_draft_tokens,
                              t.num_accepted_tokens, t.acceptance_rate)  # fmt: skip
        reason = FINISH_REASONS.get(r.finish_reason)
        return cls(r.request_id, tuple(r.token_ids), r.text, logprobs, reason, usage, timings)


@dataclass
class Completion:
    """A whole completion, gathered from its chunks."""

    request_id: str = ""
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    usage: Usage | None = None

    def add(self, chunk: Chunk) -> None:
        self.request_id = chunk.request_id
        self.text += chunk.text
        self.token_ids.extend(chunk.token_ids)
        if chunk.finish_reason is not None:
            self.finish_reason, self.usage = chunk.finish_reason, chunk.usage


@dataclass(frozen=True)
class ModelInfo:
    model_id: str
    max_model_len: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    has_chat_template: bool
    kernels: str = ""  # the server's kernel backend: torch, cpu or triton ("" when it does not say)
    max_waiting_requests: int = 0  # requests it queues before it refuses more (0 when it does not say)

    @classmethod
    def from_proto(cls, r: pb.GetModelInfoResponse) -> ModelInfo:
        return cls(r.model_id, r.max_model_len, r.vocab_size, tuple(r.eos_token_ids), r.has_chat_template,
                   r.kernels, r.max_waiting_requests)  # fmt: skip


def _chat(messages: Sequence[Mapping[str, str]]) -> pb.ChatMessages:
    return pb.ChatMessages(messages=[pb.ChatMessage(role=m["role"], content=m["content"]) for m in messages])


def generate_request(prompt: Prompt, sampling: Sampling | None, request_id: str = "") -> pb.GenerateRequest:
    request = pb.GenerateRequest(request_id=request_id, sampling=(sampling or Sampling()).to_proto())
    if isinstance(prompt, str):
        request.prompt = prompt
    elif prompt and all(isinstance(m, Mapping) for m in prompt):
        request.messages.CopyFrom(_chat(prompt))  # type: ignore[arg-type]
    else:
        request.token_ids.ids.extend(prompt)  # type: ignore[arg-type]
    return request


def tokenize_request(
    text: str | Sequence[Mapping[str, str]] | pb.ChatMessages, tools: Sequence[pb.Tool] = (), **options: Any
) -> pb.TokenizeRequest:
    if isinstance(text, str):
        return pb.TokenizeRequest(text=text, **options)
    messages = text if isinstance(text, pb.ChatMessages) else _chat(text)
    return pb.TokenizeRequest(messages=messages, tools=tools, **options)
