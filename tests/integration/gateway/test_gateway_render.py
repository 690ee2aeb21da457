"""The render endpoints (vLLM's /v1/completions/render and /v1/chat/completions/render) on the fake engine: the
token ids are exactly what a completion of the same body prefills, and bad input is refused as a completion
would refuse it. Prefix caching is off, so the fake runner sees every prompt token of a Generate."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pytest

from infer.api import pb, pb_grpc
from tests.helpers.fake_engine import FakeRunner
from tests.integration.grpc_helpers import ServerThread, running_fake_server
from tests.unit.server.gateway.gateway_helpers import error_of, first_model

MAX_MODEL_LEN = 1024
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]  # fmt: skip
CHAT = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "Hello world"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "The capital of France?"},
]
# the fields of vLLM's GenerateRequest (vllm/entrypoints/serve/disagg/protocol.py), which render answers with
VLLM_FIELDS = {"request_id", "token_ids", "features", "sampling_params", "model", "stream", "stream_options",
               "cache_salt", "priority", "kv_transfer_params"}  # fmt: skip


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    with running_fake_server(max_model_len=MAX_MODEL_LEN, num_blocks=128, enable_prefix_caching=False) as s:
        yield s


def _prefilled(server: ServerThread, path: str, http: httpx.Client, body: dict[str, Any]) -> list[int]:
    """The prompt tokens the engine computed for one generation of `body` (read off the fake runner's calls)."""
    runner = server.engine.core.runner
    assert isinstance(runner, FakeRunner)
    runner.calls.clear()
    response = http.post(path, json=body | {"max_tokens": 2})
    assert response.status_code == 200, response.text
    num_prompt = response.json()["usage"]["prompt_tokens"]
    positions = {w.start_pos + i: t for call in runner.calls for w in call for i, t in enumerate(w.token_ids)}
    return [positions[p] for p in range(num_prompt)]


def test_a_completion_renders_the_tokens_a_completion_prefills(server: ServerThread, http: httpx.Client) -> None:
    body = {"model": first_model(http), "prompt": ["Hello world, the capital", "of France"], "temperature": 0.5}
    response = http.post("/v1/completions/render", json=body, headers={"X-Request-Id": "r1"})
    assert response.status_code == 200, response.text
    first, second = response.json()
    assert set(first) >= VLLM_FIELDS and first["model"] == body["model"] and first["stream"] is False
    assert [first["request_id"], second["request_id"]] == ["cmpl-r1-0", "cmpl-r1-1"]
    for rendered, prompt in zip((first, second), body["prompt"], strict=True):
        assert rendered["token_ids"] == _prefilled(server, "/v1/completions", http, body | {"prompt": prompt})
        assert rendered["prompt"] == prompt
    assert first["sampling_params"] == {"n": 1, "temperature": 0.5, "max_tokens": 16}  # OpenAI's default max_tokens


def test_token_ids_render_as_they_are(http: httpx.Client) -> None:
    (rendered,) = http.post("/v1/completions/render", json={"model": first_model(http), "prompt": [5, 6, 7]}).json()
    assert rendered["token_ids"] == [5, 6, 7] and rendered["prompt"] is None


def test_a_chat_with_tools_renders_the_tokens_a_chat_completion_prefills(
    server: ServerThread, http: httpx.Client
) -> None:
    body = {"model": first_model(http), "messages": CHAT, "tools": TOOLS, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    response = http.post("/v1/chat/completions/render", json=body)
    assert response.status_code == 200, response.text
    rendered = response.json()
    assert set(rendered) >= VLLM_FIELDS and rendered["request_id"].startswith("chatcmpl-")
    assert rendered["stream"] is True and rendered["stream_options"] == {"include_usage": True}
    prefilled = _prefilled(server, "/v1/chat/completions", http, body | {"stream": False, "stream_options": None})
    assert rendered["token_ids"] == prefilled
    assert "get_weather" in rendered["prompt"] and rendered["prompt"].endswith("<|im_start|>assistant\n")
    # no max_tokens: a chat may run to the end of the context
    assert rendered["sampling_params"]["max_tokens"] == MAX_MODEL_LEN - len(prefilled)


def test_render_agrees_with_grpc_tokenize(server: ServerThread, http: httpx.Client) -> None:
    body = {"model": first_model(http), "messages": CHAT[1:2]}
    rendered = http.post("/v1/chat/completions/render", json=body).json()
    with grpc.insecure_channel(server.address) as channel:
        messages = pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="Hello world")])
        tokenized = pb_grpc.InferenceServiceStub(channel).Tokenize(pb.TokenizeRequest(messages=messages))
    assert rendered["token_ids"] == list(tokenized.token_ids) and rendered["prompt"] == tokenized.text


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": "Hello world " * 600}),  # past the context
        ("/v1/completions", {"prompt": "Hello world", "max_tokens": MAX_MODEL_LEN}),  # no room for max_tokens
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hello world " * 600}]}),
    ],
    ids=["prompt", "max_tokens", "chat"],
)
def test_a_render_over_the_context_is_the_400_of_a_completion(http: httpx.Client, path: str, body: dict) -> None:
    body = {"model": first_model(http), **body}
    error = error_of(http.post(path + "/render", json=body), 400)
    assert "exceeds max_model_len" in error["message"]
    assert error == error_of(http.post(path, json=body), 400)


@pytest.mark.parametrize("path", ["/v1/completions/render", "/v1/chat/completions/render"])
def test_bad_requests_are_refused_as_elsewhere(http: httpx.Client, path: str) -> None:
    body = {"model": "no-such-model", "prompt": "Hello", "messages": CHAT}
    assert error_of(http.post(path, json=body), 404)["code"] == "model_not_found"
    bad_json = http.post(path, content=b"{not json", headers={"Content-Type": "application/json"})
    assert error_of(bad_json, 400)["code"] == "invalid_json"
    assert error_of(http.post(path, json={"model": first_model(http)}), 422)["param"] in ("prompt", "messages")


def test_grpc_tokenize_with_sampling_checks_as_generate_does(server: ServerThread) -> None:
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        checked = stub.Tokenize(pb.TokenizeRequest(text="Hello world", sampling=pb.SamplingParams(max_tokens=5)))
        assert checked.max_tokens == 5 and len(checked.token_ids) > 0
        assert not stub.Tokenize(pb.TokenizeRequest(text="Hello world")).HasField("max_tokens")
        with pytest.raises(grpc.RpcError) as refused:
            stub.Tokenize(
                pb.TokenizeRequest(token_ids=pb.TokenIds(ids=[1] * MAX_MODEL_LEN), sampling=pb.SamplingParams())
            )
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "exceeds max_model_len" in str(refused.value.details())


# a pattern the grammar compiler refuses (what engine/structured/schema.py refuses, a render refused already)
NOT_COMPILED = {"type": "object", "properties": {"a": {"type": "string", "pattern": "(("}}}


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"prompt": "Hello", "guided_regex": "(("}, "guided_regex"),
        ("/v1/chat/completions", {"messages": CHAT, "response_format": {
            "type": "json_schema", "json_schema": {"name": "s", "schema": NOT_COMPILED}}}, "response_format"),
        ("/v1/chat/completions", {"messages": CHAT, "tools": [
            {"type": "function", "function": {"name": "f", "parameters": NOT_COMPILED}}]},
         "tools[0].function.parameters"),
    ],
    ids=["regex", "response_format", "tools"],
)  # fmt: skip
def test_a_render_refuses_what_a_completion_refuses(http: httpx.Client, path: str, body: dict, param: str) -> None:
    """A constraint or a tool that does not compile: the completion's 400 on the render too (it was 200)."""
    body = {"model": first_model(http), "max_tokens": 2, **body}
    error = error_of(http.post(path + "/render", json=body), 400)
    assert error["param"] == param and "does not compile" in error["message"]
    assert error == error_of(http.post(path, json=body), 400)
