"""OpenAI request bodies -> infer.v1 GenerateRequests: one per choice (prompts × n)."""

from __future__ import annotations

from infer.api import OPTIONAL_SAMPLING_FIELDS, pb
from infer.server.gateway.schemas import ChatCompletionRequest, ChatMessage, CompletionRequest, Sampling
from infer.server.gateway.structured import calls_proto, set_constraint, tool_choice_proto, tools_proto

# the optional fields a body carries under the proto's names; max_tokens and logprobs differ per endpoint
_FROM_BODY = tuple(name for name in OPTIONAL_SAMPLING_FIELDS if name not in ("max_tokens", "logprobs"))


def sampling_params(body: Sampling, max_tokens: int | None, logprobs: int | None) -> pb.SamplingParams:
    """The shared fields; unset ones stay unset (the server's defaults)."""
    params = pb.SamplingParams(stop=body.stop_strings, stop_token_ids=body.stop_token_ids or (),
                               ignore_eos=body.ignore_eos)  # fmt: skip
    for name in _FROM_BODY:
        value = getattr(body, name)
        if value is not None:
            setattr(params, name, value)
    if max_tokens is not None:
        params.max_tokens = max_tokens
    if logprobs is not None:
        params.logprobs = logprobs
    set_constraint(params, body)
    return params


def _requests(inputs: list[pb.GenerateRequest], n: int, request_id: str, seed: int | None) -> list[pb.GenerateRequest]:
    """Each input n times, in choice order (prompt-major); seeds seed, seed+1, ... so choices differ. Several
    choices share the request id and carry their index (choice_index), so no other request's id can be theirs."""
    out: list[pb.GenerateRequest] = []
    num_choices = len(inputs) * n
    for prompt_index, template in enumerate(inputs):
        for i in range(n):
            index = prompt_index * n + i
            request = pb.GenerateRequest()
            request.CopyFrom(template)
            request.request_id = request_id
            if num_choices > 1:
                request.choice_index = index
            if seed is not None:
                request.sampling.seed = (seed + index) % 2**63
            out.append(request)
    return out


def completion_requests(body: CompletionRequest, request_id: str) -> list[pb.GenerateRequest]:
    sampling = sampling_params(body, body.max_tokens, body.logprobs)
    inputs = []
    for prompt in body.prompts:
        if isinstance(prompt, str):
            inputs.append(pb.GenerateRequest(prompt=prompt, sampling=sampling))
        else:
            inputs.append(pb.GenerateRequest(token_ids=pb.TokenIds(ids=prompt), sampling=sampling))
    return _requests(inputs, body.n, request_id, body.seed)


def chat_message(m: ChatMessage) -> pb.ChatMessage:
    message = pb.ChatMessage(role=m.role, content=m.text, tool_calls=calls_proto(m.tool_calls or []))
    if m.role == "tool":
        message.tool_call_id, message.name = m.tool_call_id or "", m.name or ""
    return message


def chat_messages(messages: list[ChatMessage]) -> pb.ChatMessages:
    return pb.ChatMessages(messages=[chat_message(m) for m in messages])


def chat_requests(body: ChatCompletionRequest, request_id: str, max_tokens: int | None) -> list[pb.GenerateRequest]:
    """`max_tokens` None: as many as the context leaves after the rendered chat (the model server works it out,
    capped by its max_output_tokens)."""
    sampling = sampling_params(body, max_tokens, body.num_logprobs)
    sampling.max_tokens_from_context = max_tokens is None
    request = pb.GenerateRequest(messages=chat_messages(body.messages), sampling=sampling,
                                 tools=tools_proto(body.tools or []))  # fmt: skip
    if body.tool_choice is not None:
        request.tool_choice.CopyFrom(tool_choice_proto(body.tool_choice))
    if body.parallel_tool_calls is not None:
        request.parallel_tool_calls = body.parallel_tool_calls
    return _requests([request], body.n, request_id, body.seed)


def tokenize_request(request: pb.GenerateRequest) -> pb.TokenizeRequest:
    """A Tokenize of what this Generate would prefill, checked with its sampling (the render endpoints)."""
    out = pb.TokenizeRequest(tools=request.tools, sampling=request.sampling)
    kind = request.WhichOneof("input")
    if kind == "prompt":
        out.text = request.prompt
    elif kind == "token_ids":
        out.token_ids.CopyFrom(request.token_ids)
    elif kind == "messages":
        out.messages.CopyFrom(request.messages)
    return out
