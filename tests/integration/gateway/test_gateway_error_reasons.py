"""No HTTP status depends on the words of an error: every engine message reworded, every status stays.

The gateway maps a refusal by its gRPC code and the reason in its trailing metadata (`infer.api.ErrorReason`),
never by its text. Here the real servicer and engine (the fake model) refuse requests for each reason, first
with their own words, then with every `InvalidInput` and `QueueFullError` message replaced: by words that say
nothing, and by words that name every other reason ("exceeds max_model_len", "already in flight", "does not
compile"). The status, the error code and the param must not move.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import httpx
import pytest

from infer.api import SERVICE_NAME, ErrorReason, error_reason
from infer.clients import InferClient, InferError, Sampling
from infer.engine import InvalidInput, QueueFullError
from infer.engine.core import EngineCore
from tests.helpers.fake_engine import FakeRunner
from tests.integration.grpc_helpers import ServerThread, running_fake_server
from tests.unit.server.gateway.gateway_helpers import first_model, wait_for

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
LIMITS = {"max_prompt_tokens": 40, "max_output_tokens": 8, "max_chat_messages": 4, "max_prompt_chars": 400}
REWORDINGS = {
    "as-written": None,
    "reworded": "the request was not taken",
    "misleading": "exceeds max_model_len; is already in flight; does not compile; queue full",
}
REFUSED_SCHEMA = {"type": "object", "properties": {"a": {"not": {"type": "string"}}}}  # `not` is not enforced
TOOL = {"type": "function", "function": {"name": "f", "parameters": REFUSED_SCHEMA}}
# NOTE: engine/structured/schema.py's refusals carry no reason yet: engine/validation.py tells them by their words


def _chat(*contents: str, **fields: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": c} for c in contents], "max_tokens": 2, **fields}


def _completion(prompt: str | list[int], **fields: Any) -> dict[str, Any]:
    return {"prompt": prompt, "max_tokens": 2, **fields}


# name: (path, body, (status, code, param))
CASES: dict[str, tuple[str, dict[str, Any], tuple[int, str, str | None]]] = {
    # context length: the server's size bounds (server/limits.py), then the engine's input processor
    "prompt-tokens-over-max_prompt_tokens": (COMPLETIONS, _completion([5] * 50),
                                             (400, "context_length_exceeded", "prompt")),
    "prompt-chars-over-max_prompt_chars": (COMPLETIONS, _completion("x" * 500),
                                           (400, "context_length_exceeded", "prompt")),
    "messages-over-max_chat_messages": (CHAT, _chat(*["hi"] * 5), (400, "context_length_exceeded", "messages")),
    "rendered-chat-over-max_prompt_chars": (CHAT, _chat(*["y" * 95] * 4),
                                            (400, "context_length_exceeded", "messages")),
    "text-tokens-over-max_prompt_tokens": (COMPLETIONS, _completion("q z " * 60),
                                           (400, "context_length_exceeded", "prompt")),
    "prompt-and-max_tokens-over-max_model_len": (COMPLETIONS, _completion([5] * 30, max_tokens=40),
                                                 (400, "context_length_exceeded", "max_tokens")),
    # over an operator's limit that is not the prompt's size, and plain bad values
    "max_tokens-over-max_output_tokens": (COMPLETIONS, _completion([5] * 3, max_tokens=10),
                                          (422, "invalid_value", "max_tokens")),
    "token-id-out-of-the-vocabulary": (COMPLETIONS, _completion([10**6]), (422, "invalid_value", "prompt")),
    "stop-token-id-out-of-the-vocabulary": (COMPLETIONS, _completion("Hello", stop_token_ids=[10**6]),
                                            (422, "invalid_value", "stop_token_ids")),
    # does not compile: the grammar compiler's refusal, the schema check's, a tool's parameters
    "regex-that-does-not-compile": (COMPLETIONS, _completion("Hello", guided_regex="(("),
                                    (400, "invalid_value", "guided_regex")),
    "schema-that-is-not-enforced": (CHAT, _chat("Hi", response_format={
        "type": "json_schema", "json_schema": {"name": "s", "schema": REFUSED_SCHEMA}}),
        (400, "invalid_value", "response_format")),
    "tool-parameters-not-enforced": (CHAT, _chat("Hi", tools=[TOOL]),
                                     (400, "invalid_value", "tools[0].function.parameters")),
}  # fmt: skip


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    with running_fake_server(LIMITS, max_model_len=64, max_waiting_requests=1) as s:
        yield s


@pytest.fixture(params=list(REWORDINGS))
def words(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str | None:
    """Every engine message replaced by these words (None: as written)."""
    words = REWORDINGS[request.param]
    if words is not None:
        invalid_input_init = InvalidInput.__init__

        def reworded_invalid_input(self: InvalidInput, field: str, message: str, *args: Any, **kwargs: Any) -> None:
            invalid_input_init(self, field, words, *args, **kwargs)

        def reworded_queue_full(self: QueueFullError, *args: Any, **kwargs: Any) -> None:
            RuntimeError.__init__(self, words)

        monkeypatch.setattr(InvalidInput, "__init__", reworded_invalid_input)
        monkeypatch.setattr(QueueFullError, "__init__", reworded_queue_full)
    return words


def _refusal(response: httpx.Response) -> tuple[int, str, str | None]:
    error = response.json()["error"]
    return response.status_code, error["code"], error["param"]


@pytest.mark.parametrize("case", list(CASES))
def test_a_refusals_status_does_not_depend_on_its_words(http: httpx.Client, words: str | None, case: str) -> None:
    path, body, expected = CASES[case]
    response = http.post(path, json={"model": first_model(http), **body})
    assert _refusal(response) == expected, response.text
    if words is not None:
        assert words in response.json()["error"]["message"]  # the engine's words reached the client


def test_a_grpc_client_reads_the_reason_and_the_field(server: ServerThread, words: str | None) -> None:
    """The same contract at the gRPC door: `InferError.reason` and `.field`, from the trailing metadata."""
    cases = [
        (list(range(50)), Sampling(max_tokens=2), ErrorReason.CONTEXT_LENGTH_EXCEEDED, "prompt"),
        ([5, 6, 7], Sampling(max_tokens=10), ErrorReason.OVER_LIMIT, "sampling.max_tokens"),
        ([10**6], Sampling(max_tokens=2), ErrorReason.INVALID_VALUE, "token_ids"),
    ]
    with InferClient(server.address, timeout_s=30) as client:
        for prompt, sampling, reason, field in cases:
            with pytest.raises(InferError) as info:
                client.complete(prompt, sampling)
            assert (info.value.reason, info.value.field) == (reason, field), info.value


def test_a_malformed_message_is_an_invalid_value(server: ServerThread) -> None:
    with grpc.insecure_channel(server.address) as channel, pytest.raises(grpc.RpcError) as info:
        channel.unary_unary(f"/{SERVICE_NAME}/Tokenize")(b"\xff\xff\xff", timeout=10)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert error_reason(info.value.trailing_metadata()) is ErrorReason.INVALID_VALUE


def test_a_duplicate_id_and_a_full_queue_keep_their_status(
    http: httpx.Client, words: str | None, stalled: EngineCore
) -> None:
    def post(request_id: str) -> Callable[[], httpx.Response]:
        body = {"model": first_model(http), **_completion("Hello")}
        return lambda: http.post(COMPLETIONS, json=body, headers={"X-Request-Id": request_id})

    runner = stalled.runner
    assert isinstance(runner, FakeRunner)
    num_calls = len(runner.calls)
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(post("first"))  # its first forward pass waits for the gate: it fills the queue
        try:
            wait_for(lambda: len(runner.calls) > num_calls)
            duplicate, full = post("first")(), post("second")()  # max_waiting_requests=1
        finally:
            runner.gate.set()
        assert first.result(30).status_code == 200
    assert _refusal(duplicate) == (409, "duplicate_request_id", "X-Request-Id"), duplicate.text
    assert _refusal(full) == (429, "rate_limit_exceeded", None), full.text
    if words is not None:
        assert words in full.json()["error"]["message"]
