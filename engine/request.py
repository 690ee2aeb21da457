"""A request's state inside the engine, and the deltas it streams out."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from infer.engine.detokenizer import IncrementalDetokenizer
from infer.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    import torch

    from infer.engine.speculation.state import SpecState
    from infer.engine.structured.grammar_state import GrammarState
    from infer.engine.tools.parsers import ToolCallDelta


DEFAULT_TENANT = "default"  # a request's tenant when its caller names none


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(enum.StrEnum):
    STOP = "stop"  # eos, a stop token or a stop string
    LENGTH = "length"  # max_tokens or max_model_len
    ABORT = "abort"  # cancelled by the caller
    ERROR = "error"  # this request failed; the engine goes on
    TOOL_CALLS = "tool_calls"  # a STOP whose output held tool calls: set by `CallerOutputs`, never by the core


@dataclass(eq=False)  # a request is itself, whatever its fields
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time_s: float
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache at first admission
    status: RequestStatus = RequestStatus.WAITING
    num_preemptions: int = 0
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    grammar: GrammarState | None = None  # set when params.constraint is: compiling, then its matcher
    # speculation: all of it here (the scheduler reads the drafts; the verifier counts and adapts)
    spec: SpecState | None = None  # its drafting, when it speculates (set when taken in)
    num_draft_tokens: int = 0  # drafts verified so far
    num_accepted_tokens: int = 0  # of which accepted
    tenant: str = DEFAULT_TENANT  # who asks (the server's API key name or header), for the fair policy

    @property
    def is_ready(self) -> bool:
        """Whether it can be scheduled: it has no constraint, or its grammar has compiled."""
        return self.grammar is None or self.grammar.matcher is not None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens_to_compute(self) -> int:
        """Tokens whose K/V are not in the cache yet: the prompt (or what is left of it), then the newest token."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_slice(self, start: int, end: int) -> list[int]:
        """Tokens [start, end) of prompt + output, without building the whole list."""
        num_prompt = len(self.prompt_token_ids)
        if end <= num_prompt:
            return self.prompt_token_ids[start:end]
        if start >= num_prompt:
            return self.output_token_ids[start - num_prompt : end - num_prompt]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - num_prompt]

    def usage(self) -> Usage:
        return Usage(self.num_prompt_tokens, self.num_output_tokens, self.num_cached_tokens)

    def timings(self, now_s: float) -> Timings:
        return Timings(
            queue_s=(self.first_scheduled_s or now_s) - self.arrival_time_s,
            ttft_s=(self.first_token_s or now_s) - self.arrival_time_s,
            total_s=now_s - self.arrival_time_s,
            num_preemptions=self.num_preemptions,
            num_draft_tokens=self.num_draft_tokens,
            num_accepted_tokens=self.num_accepted_tokens,
        )


@dataclass(eq=False, kw_only=True)
class LiveRequest(Request):
    """A request as the engine core runs it: where its deltas go, its text so far, its own random stream.

    The scheduler's table holds these; the scheduler itself only reads the `Request` part.
    """

    sink: Sink
    detokenizer: IncrementalDetokenizer
    generator: torch.Generator | None = None  # set on the stepping thread when the request is taken in


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token id, logprob), best first
    # the tokens' text (decoded alone, special tokens shown): filled by `CallerOutputs`, off the step thread
    token: str | None = field(default=None, compare=False)
    top_tokens: tuple[str, ...] = field(default=(), compare=False)  # one a `top` entry


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass(frozen=True)
class Timings:
    queue_s: float  # arrival to first scheduled
    ttft_s: float  # arrival to first token
    total_s: float
    num_preemptions: int
    num_draft_tokens: int = 0  # speculative drafts verified
    num_accepted_tokens: int = 0  # of which accepted

    @property
    def acceptance_rate(self) -> float:
        """Accepted / verified drafts; 0 without drafts."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0


@dataclass(frozen=True)
class RequestOutput:
    """One streamed delta: new tokens and text; the last one also says why and how it ended."""

    request_id: str
    token_ids: list[int]
    text: str
    logprobs: list[TokenLogprob] | None = None
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    timings: Timings | None = None
    error: str | None = None
    tool_calls: tuple[ToolCallDelta, ...] = ()  # parsed out of the text by `CallerOutputs` (a chat with tools)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


Sink = Callable[[RequestOutput], None]  # where a request's deltas go; called on the stepping thread
