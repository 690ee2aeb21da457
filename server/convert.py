"""Proto <-> engine types. Nothing else: no I/O, no engine calls, no rendering or tokenizing (the engine's
input processor does that)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infer.api import CHAT_ROLES, OPTIONAL_SAMPLING_FIELDS, REQUEST_ID, pb
from infer.engine import (
    Constraint,
    EngineClient,
    FinishReason,
    InvalidInput,
    ProcessedInput,
    Prompt,
    RequestOutput,
    SamplingParams,
    TokenLogprob,
    Tool,
    ToolChoice,
    ToolChoiceMode,
)
from infer.server.limits import InputBounds

_FINISH_REASONS = {
    FinishReason.STOP: pb.FINISH_REASON_STOP,
    FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
    FinishReason.TOOL_CALLS: pb.FINISH_REASON_TOOL_CALLS,
}
_TOOL_CHOICE_MODES = {
    pb.TOOL_CHOICE_MODE_AUTO: ToolChoiceMode.AUTO,
    pb.TOOL_CHOICE_MODE_NONE: ToolChoiceMode.NONE,
    pb.TOOL_CHOICE_MODE_REQUIRED: ToolChoiceMode.REQUIRED,
}


def sampling_params(proto: pb.SamplingParams) -> SamplingParams:
    """Engine parameters; unset fields keep the engine defaults. InvalidInput names the field (`sampling.top_p`)."""
    values: dict[str, Any] = {name: getattr(proto, name) for name in OPTIONAL_SAMPLING_FIELDS if proto.HasField(name)}
    values |= {"stop": tuple(proto.stop), "stop_token_ids": tuple(proto.stop_token_ids), "ignore_eos": proto.ignore_eos}
    if proto.max_tokens_from_context and not proto.HasField("max_tokens"):
        values["max_tokens"] = None  # the engine's input processor fills in what the context leaves
    try:
        return SamplingParams(**values, constraint=_constraint(proto))
    except InvalidInput as e:
        raise e.within("sampling") from None


def _constraint(proto: pb.SamplingParams) -> Constraint | None:
    kind = proto.WhichOneof("constraint")
    if kind is None:
        return None
    if kind == "choice":
        return Constraint.choice(list(proto.choice.choices))
    if kind == "json_object":
        return Constraint.json_object()
    return Constraint.of(kind, getattr(proto, kind))


def check_request_id(request_id: str) -> None:
    """An empty id is fine (the server makes one); else 1 to 128 visible ASCII characters."""
    if request_id and not REQUEST_ID.match(request_id):
        raise InvalidInput("request_id", "must be 1 to 128 visible ASCII characters")


def engine_request_id(request_id: str, request: pb.GenerateRequest) -> str:
    """The engine's id of a request: its request_id, or with a choice_index `<request_id> (choice <i>)`.

    NOTE: a request_id has no space, so no client's request_id is ever a choice's engine id: the `n`
    choices of `x` cannot collide with another client's `x-1` (or `x (choice 1)`, which is refused).
    """
    if not request.HasField("choice_index"):
        return request_id
    return f"{request_id} (choice {request.choice_index})"


def _tools(request: pb.GenerateRequest | pb.TokenizeRequest) -> list[Tool]:
    tools = []
    for i, t in enumerate(request.tools):
        try:
            tools.append(Tool(t.name, t.description, t.parameters))
        except InvalidInput as e:
            raise e.within(f"tools[{i}]") from None
    return tools


def _tool_choice(request: pb.GenerateRequest) -> ToolChoice:
    if not request.HasField("tool_choice"):
        return ToolChoice()
    if request.tool_choice.WhichOneof("choice") == "function":
        return ToolChoice(ToolChoiceMode.FUNCTION, request.tool_choice.function)
    return ToolChoice(_TOOL_CHOICE_MODES.get(request.tool_choice.mode, ToolChoiceMode.AUTO))


def _messages(proto: pb.ChatMessages) -> list[dict[str, Any]]:
    messages = []
    for i, m in enumerate(proto.messages):
        if m.role not in CHAT_ROLES:
            raise InvalidInput(f"messages[{i}].role", f"{m.role!r} is not one of {', '.join(CHAT_ROLES)}")
        # "developer" is OpenAI's newer name for the system role; chat templates know "system"
        message: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": m.content}
        if m.tool_calls:
            if m.role != "assistant":
                raise InvalidInput(f"messages[{i}].tool_calls", "only an assistant message has tool calls")
            message["tool_calls"] = [{"id": c.id, "type": "function",
                                      "function": {"name": c.name, "arguments": c.arguments}}
                                     for c in m.tool_calls]  # fmt: skip
        if m.role == "tool":
            message["tool_call_id"] = m.tool_call_id
            if m.name:
                message["name"] = m.name
        messages.append(message)
    return messages


def prompt(request: pb.GenerateRequest) -> Prompt:
    """The request's input as the engine takes it (the messages converted: a thread's work for a long chat)."""
    kind = request.WhichOneof("input")
    tools = _tools(request)
    if kind == "prompt":
        return Prompt(text=request.prompt, tools=tools)
    if kind == "token_ids":
        return Prompt(token_ids=request.token_ids.ids, tools=tools)
    if kind == "messages":
        parallel = request.parallel_tool_calls if request.HasField("parallel_tool_calls") else True
        return Prompt(messages=_messages(request.messages), tools=tools, tool_choice=_tool_choice(request),
                      parallel_tool_calls=parallel)  # fmt: skip
    raise InvalidInput("input", "one of prompt, token_ids or messages is required")


def tokenize_prompt(request: pb.TokenizeRequest) -> Prompt:
    kind = request.WhichOneof("input")
    tools = _tools(request)
    if kind == "text":
        add_special = request.add_special_tokens if request.HasField("add_special_tokens") else True
        return Prompt(text=request.text, tools=tools, add_special_tokens=add_special)
    if kind == "messages":
        add_prompt = request.add_generation_prompt if request.HasField("add_generation_prompt") else True
        return Prompt(messages=_messages(request.messages), tools=tools, add_generation_prompt=add_prompt)
    if kind == "token_ids":
        return Prompt(token_ids=request.token_ids.ids)
    raise InvalidInput("input", "one of text, messages or token_ids is required")


def tokenize_response(request: pb.TokenizeRequest, processed: ProcessedInput) -> pb.TokenizeResponse:
    text = processed.rendered if processed.rendered is not None else request.text
    response = pb.TokenizeResponse(token_ids=processed.prompt_token_ids, text=text)
    if request.HasField("sampling") and processed.params.max_tokens is not None:  # settled by process()
        response.max_tokens = processed.params.max_tokens
    return response


@dataclass(frozen=True)
class InputSize:
    """How big a request's input is, as it arrived: what rendering and tokenizing it will cost."""

    num_chars: int = 0  # text, or the chat's roles and contents
    num_messages: int = 0
    num_token_ids: int = 0


def checked_input_size(request: pb.GenerateRequest | pb.TokenizeRequest, bounds: InputBounds) -> InputSize:
    """The input's size, refused (InvalidInput naming the limit) when over `bounds`. Cheap: no template, no
    tokenizer, and a chat's characters are counted only once its message count is within bounds."""
    kind = request.WhichOneof("input")
    if kind == "prompt" or kind == "text":
        size = InputSize(num_chars=len(getattr(request, kind)))
        bounds.check_chars(kind, size.num_chars)
    elif kind == "token_ids":
        size = InputSize(num_token_ids=len(request.token_ids.ids))
        bounds.check_tokens(size.num_token_ids)
    elif kind == "messages":
        messages = request.messages.messages
        bounds.check_messages(len(messages))
        size = InputSize(sum(len(m.role) + len(m.content) for m in messages), len(messages))
        bounds.check_chars("messages", size.num_chars, "the roles and contents are ")
    else:
        size = InputSize()  # no input: the conversion names the missing field
    return size


def _logprob(lp: TokenLogprob) -> pb.TokenLogprob:
    texts = lp.top_tokens or ("",) * len(lp.top)  # the engine's `CallerOutputs` fills in the tokens' text
    top = [pb.TopLogprob(token_id=t, logprob=v, token=text) for (t, v), text in zip(lp.top, texts, strict=True)]
    return pb.TokenLogprob(token_id=lp.token_id, logprob=lp.logprob, token=lp.token or "", top=top)


def generate_response(out: RequestOutput, request_id: str | None = None) -> pb.GenerateResponse:
    """One streamed message (as the engine's `CallerOutputs` made it: logprob tokens' text, tool calls); the last
    also carries finish reason, usage and timings. `request_id`: the client's (default: the engine's id, which
    differs for a choice)."""
    response = pb.GenerateResponse(request_id=out.request_id if request_id is None else request_id,
                                   token_ids=out.token_ids, text=out.text)  # fmt: skip
    for call in out.tool_calls:
        response.tool_calls.add(index=call.index, id=call.id, name=call.name, arguments=call.arguments)
    if out.logprobs:
        response.logprobs.extend(_logprob(lp) for lp in out.logprobs)
    if out.finish_reason in _FINISH_REASONS:
        response.finish_reason = _FINISH_REASONS[out.finish_reason]
    if out.usage is not None:
        u = out.usage
        response.usage.CopyFrom(pb.Usage(prompt_tokens=u.prompt_tokens, completion_tokens=u.completion_tokens,
                                         cached_tokens=u.cached_tokens))  # fmt: skip
    if out.timings is not None:
        t = out.timings
        response.timings.CopyFrom(pb.Timings(queue_s=t.queue_s, ttft_s=t.ttft_s, total_s=t.total_s,
                                             num_preemptions=t.num_preemptions, num_draft_tokens=t.num_draft_tokens,
                                             num_accepted_tokens=t.num_accepted_tokens,
                                             acceptance_rate=t.acceptance_rate))  # fmt: skip
    return response


def model_info(engine: EngineClient) -> pb.GetModelInfoResponse:
    info = engine.model_info
    return pb.GetModelInfoResponse(
        model_id=info.model_id,
        max_model_len=engine.config.max_model_len,
        vocab_size=info.vocab_size,
        eos_token_ids=info.eos_token_ids,
        has_chat_template=info.has_chat_template,
        max_waiting_requests=engine.config.max_waiting_requests,
        kernels=info.kernels,
    )
