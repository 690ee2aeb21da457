"""Gateway errors, in OpenAI's JSON shape: malformed (400) and invalid (422) bodies, unknown models (404), and the
gRPC status codes of the upstream (a fake here) mapped to 429 / 503 / 504 / 500 with Retry-After where it helps.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from tests.unit.server.gateway.gateway_helpers import (
    CHAT,
    COMPLETIONS,
    FAKE_EOS_TOKEN_IDS,
    FAKE_MODEL,
    FakeInference,
    LoopThread,
    RunningGateway,
    chat_body,
    completion_body,
    error_of,
    running_gateway,
    sse_data,
)

# 400 / 404 / 422


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT])
@pytest.mark.parametrize("body", [b"{", b"", b"\xff\xfe{", b"[1, 2]", b'"text"'])
def test_malformed_json_is_400(http: httpx.Client, path: str, body: bytes) -> None:
    error = error_of(http.post(path, content=body, headers={"Content-Type": "application/json"}), 400)
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_json"


@pytest.mark.parametrize(
    ("path", "body", "param", "code"),
    [
        (CHAT, chat_body(functions=[{"name": "f"}]), "functions", "unsupported_value"),
        (COMPLETIONS, completion_body(temperature="0.5"), "temperature", "invalid_value"),  # known fields: strict
        (COMPLETIONS, {"prompt": "Hi"}, "model", "missing_required_parameter"),
        (COMPLETIONS, completion_body(temperature="hot"), "temperature", "invalid_value"),
        (COMPLETIONS, completion_body(max_tokens=1.5), "max_tokens", "invalid_value"),
        (COMPLETIONS, completion_body(n=0), "n", "invalid_value"),
        (COMPLETIONS, completion_body(n=129), "n", "invalid_value"),
        (COMPLETIONS, completion_body(prompt=[]), "prompt", "unsupported_value"),
        (COMPLETIONS, completion_body(prompt=[1, "a"]), "prompt[0]", "invalid_value"),
        (COMPLETIONS, completion_body(logprobs=21), "logprobs", "invalid_value"),
        (COMPLETIONS, completion_body(echo=True), "echo", "unsupported_value"),
        (COMPLETIONS, completion_body(best_of=3), "best_of", "unsupported_value"),
        (COMPLETIONS, completion_body(logit_bias={"50256": -100}), "logit_bias", "unsupported_value"),
        (COMPLETIONS, completion_body(stream_options={"include_usage": True}), "stream_options", "unsupported_value"),
        (CHAT, chat_body(messages=[]), "messages", "invalid_value"),
        (CHAT, chat_body(messages=[{"role": "root", "content": "x"}]), "messages[0].role", "invalid_value"),
        (
            CHAT,
            chat_body(messages=[{"role": "user", "content": [{"type": "image_url"}]}]),
            "messages[0].content[0]",
            "unsupported_value",
        ),
        (CHAT, chat_body(top_logprobs=2), "top_logprobs", "unsupported_value"),
        (CHAT, chat_body(tools=[{"type": "function"}]), "tools[0].function", "missing_required_parameter"),
        (CHAT, chat_body(tool_choice="required"), "tool_choice", "unsupported_value"),
        (CHAT, chat_body(response_format={"type": "xml"}), "response_format.type", "invalid_value"),
        (CHAT, chat_body(guided_regex="a", guided_choice=["a"]), "guided_choice", "unsupported_value"),
        (CHAT, chat_body(seed=-1), "seed", "invalid_value"),
    ],
)
def test_invalid_request_is_422_naming_the_field(
    http: httpx.Client, fake: FakeInference, path: str, body: dict[str, Any], param: str, code: str | None
) -> None:
    error = error_of(http.post(path, json=body), 422)
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert code is None or error["code"] == code
    assert param.split("[")[0].split(".")[0] in error["message"]
    assert fake.requests == []  # refused before reaching the model server


def test_fields_sdks_send_are_accepted(http: httpx.Client) -> None:
    extras = {"user": "u-1", "logit_bias": {}, "parallel_tool_calls": False, "tool_choice": "none", "tools": []}
    body = chat_body(response_format={"type": "text"}, stream=True, stream_options={"include_usage": True}, **extras)
    body["messages"] = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}], "name": "me"},
        {"role": "assistant", "content": None},
    ]
    assert http.post(CHAT, json=body).status_code == 200


def test_unknown_model_is_404(http: httpx.Client) -> None:
    for path, body in ((COMPLETIONS, completion_body(model="gpt-4")), (CHAT, chat_body(model="gpt-4"))):
        error = error_of(http.post(path, json=body), 404)
        assert error["code"] == "model_not_found" and error["param"] == "model" and FAKE_MODEL in error["message"]
    assert error_of(http.get("/v1/models/gpt-4"), 404)["code"] == "model_not_found"
    assert http.get(f"/v1/models/{FAKE_MODEL}").json()["id"] == FAKE_MODEL


def test_the_model_card_lists_the_ids_that_end_a_generation(http: httpx.Client) -> None:
    assert http.get("/v1/models").json()["data"][0]["eos_token_ids"] == list(FAKE_EOS_TOKEN_IDS)
    assert http.get(f"/v1/models/{FAKE_MODEL}").json()["eos_token_ids"] == list(FAKE_EOS_TOKEN_IDS)


def test_unknown_route_and_method_in_openai_shape(http: httpx.Client) -> None:
    assert error_of(http.post("/v1/embeddings", json={}), 404)["code"] == "not_found"
    assert error_of(http.get(COMPLETIONS), 405)["code"] == "method_not_allowed"


# upstream status codes


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("upstream_code", "status", "code", "retry_after"),
    [
        ("RESOURCE_EXHAUSTED", 429, "rate_limit_exceeded", "1"),
        ("UNAVAILABLE", 503, "service_unavailable", "2"),
        ("CANCELLED", 503, "service_unavailable", "2"),
        ("DEADLINE_EXCEEDED", 504, "deadline_exceeded", None),
        ("INTERNAL", 500, "internal_error", None),
        ("UNIMPLEMENTED", 502, "upstream_error", None),
    ],
)
def test_upstream_status_maps_to_http(
    http: httpx.Client, upstream_code: str, status: int, code: str, retry_after: str | None, stream: bool
) -> None:
    response = http.post(COMPLETIONS, json=completion_body(prompt=f"status:{upstream_code}", stream=stream))
    assert error_of(response, status)["code"] == code
    assert response.headers.get("retry-after") == retry_after


@pytest.mark.parametrize(
    ("reason", "details", "status", "param", "code"),
    [
        ("", "sampling.top_p: must be in (0, 1]", 422, "top_p", "invalid_value"),
        ("", "token_ids: ids must be in [0, 100)", 422, "prompt", "invalid_value"),
        ("", "messages[1].role: 'root' is not one of system, user", 422, "messages[1].role", "invalid_value"),
        ("", "input: one of prompt, token_ids or messages is required", 422, None, "invalid_value"),
        ("CONTEXT_LENGTH_EXCEEDED", "sampling.max_tokens: prompt (60 tokens) + max_tokens (16) exceeds max_model_len "
         "(64)", 400, "max_tokens", "context_length_exceeded"),
        ("DUPLICATE_REQUEST_ID", "request_id: 'x' is already in flight", 409, "X-Request-Id", "duplicate_request_id"),
        ("", "request_id: must be 1 to 128 visible ASCII characters", 422, "X-Request-Id", "invalid_value"),
    ],
)  # fmt: skip
def test_upstream_invalid_argument_names_the_field(
    http: httpx.Client, reason: str, details: str, status: int, param: str | None, code: str
) -> None:
    """The param is the body's name of the field the model server names (its trailing metadata); the status is
    the reason's (INVALID_VALUE unless given)."""
    prompt = f"status:INVALID_ARGUMENT{'/' if reason else ''}{reason}:{details}"
    error = error_of(http.post(CHAT, json=chat_body(messages=[{"role": "user", "content": prompt}])), status)
    assert (error["param"], error["code"], error["message"]) == (param, code, details)


MISLEADING = "exceeds max_model_len (64); 'x' is already in flight; does not compile; queue full"


@pytest.mark.parametrize(
    ("refusal", "status", "code"),
    [
        ("INVALID_ARGUMENT/INVALID_VALUE", 422, "invalid_value"),
        ("INVALID_ARGUMENT/OVER_LIMIT", 422, "invalid_value"),
        ("INVALID_ARGUMENT/CONTEXT_LENGTH_EXCEEDED", 400, "context_length_exceeded"),
        ("INVALID_ARGUMENT/DUPLICATE_REQUEST_ID", 409, "duplicate_request_id"),
        ("INVALID_ARGUMENT/DOES_NOT_COMPILE", 422, "invalid_value"),  # 400 only for a constraint's or tool's field
        ("INVALID_ARGUMENT/A_NEWER_SERVERS_REASON", 422, "invalid_value"),
        ("RESOURCE_EXHAUSTED/QUEUE_FULL", 429, "rate_limit_exceeded"),
        ("RESOURCE_EXHAUSTED", 429, "rate_limit_exceeded"),  # gRPC's own (a message over its size limit)
        ("UNAVAILABLE/NOT_SERVING", 503, "service_unavailable"),
        ("UNAVAILABLE/CONTEXT_LENGTH_EXCEEDED", 503, "service_unavailable"),  # a reason never crosses codes
    ],
)
def test_the_status_is_the_codes_and_reasons_never_the_words(
    http: httpx.Client, refusal: str, status: int, code: str
) -> None:
    """The upstream's message names every other reason; only the code and the trailing reason count."""
    body = chat_body(messages=[{"role": "user", "content": f"status:{refusal}:sampling.top_p: {MISLEADING}"}])
    error = error_of(http.post(CHAT, json=body), status)
    assert error["code"] == code and MISLEADING in error["message"]


def test_the_status_of_a_constraint_field_is_its_reasons(http: httpx.Client) -> None:
    """A refused regex: 400 when it does not compile, 422 when it is a bad value (too long), whatever it says."""
    for reason, status in (("DOES_NOT_COMPILE", 400), ("INVALID_VALUE", 422), ("OVER_LIMIT", 422)):
        content = f"status:INVALID_ARGUMENT/{reason}:sampling.regex: {MISLEADING}"
        body = chat_body(messages=[{"role": "user", "content": content}], guided_regex="a+")
        assert error_of(http.post(CHAT, json=body), status)["param"] == "guided_regex"


def test_unreachable_upstream_is_503(loop: LoopThread) -> None:
    with running_gateway("127.0.0.1:1", loop) as gateway, httpx.Client(base_url=gateway.url, timeout=30) as http:
        for response in (http.get("/v1/models"), http.post(COMPLETIONS, json=completion_body())):
            assert error_of(response, 503)["code"] == "service_unavailable"
            assert response.headers["retry-after"] == "2"
        health = http.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "unavailable"


def test_openai_client_raises_typed_errors(gateway: RunningGateway) -> None:
    client = openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)
    cases = [
        ("status:RESOURCE_EXHAUSTED", openai.RateLimitError),
        ("status:UNAVAILABLE", openai.InternalServerError),
        ("status:INVALID_ARGUMENT:sampling.top_p: bad", openai.UnprocessableEntityError),
    ]
    for prompt, error_type in cases:
        with pytest.raises(error_type) as info:
            client.completions.create(model=FAKE_MODEL, prompt=prompt, max_tokens=2)
        assert isinstance(info.value.body, dict) and info.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "Hi"}])
    with pytest.raises(openai.APIError, match="fake engine failure"):
        for _ in client.completions.create(model=FAKE_MODEL, prompt="fail-midway", stream=True):
            pass


def test_error_mid_stream_is_an_error_event_then_done(http: httpx.Client) -> None:
    response = http.post(COMPLETIONS, json=completion_body(prompt="fail-midway", stream=True))
    assert response.status_code == 200
    events = sse_data(response)
    assert [json.loads(e)["choices"][0]["text"] for e in events[:2]] == ["Hello", " world"]
    assert json.loads(events[2])["error"]["code"] == "internal_error"
    assert events[3:] == ["[DONE]"]


# what real clients send


def test_unknown_fields_are_ignored_and_logged_once(http: httpx.Client, caplog: pytest.LogCaptureFixture) -> None:
    extras = {"store": False, "metadata": {"k": "v"}, "reasoning_effort": "low", "service_tier": "auto",
              "prompt_cache_key": "k", "chat_template_kwargs": {"enable_thinking": False}}  # fmt: skip
    body = chat_body(**extras)
    body["messages"].append({"role": "assistant", "content": "Hi!", "refusal": None, "annotations": [], "audio": None})
    body["messages"].append({"role": "user", "content": "Again"})
    caplog.set_level("INFO", logger="infer.server.gateway.schemas")
    for _ in range(2):
        assert http.post(CHAT, json=body).status_code == 200
    logged = [r.getMessage() for r in caplog.records if "ignoring the unknown field" in r.getMessage()]
    for name in [*extras, "messages[].refusal", "messages[].annotations", "messages[].audio"]:
        assert sum(f"'{name}'" in line for line in logged) == 1, name


def test_a_replayed_assistant_message_works_with_the_openai_client(gateway: RunningGateway) -> None:
    client = openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "Hi"}]
    first = client.chat.completions.create(model=FAKE_MODEL, messages=messages, max_tokens=2)
    messages += [first.choices[0].message.model_dump(), {"role": "user", "content": "And?"}]
    second = client.chat.completions.create(model=FAKE_MODEL, messages=messages, max_tokens=2, store=False)
    assert second.choices[0].message.content


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (COMPLETIONS, '{"model": "fake-model", "prompt": "a\\ud800b"}'),
        (COMPLETIONS, '{"model": "fake-model", "prompt": "hi", "stop": ["\\udfff"]}'),
        (CHAT, '{"model": "fake-model", "messages": [{"role": "user", "content": "\\ud83d"}]}'),
    ],
    ids=["prompt", "stop", "message"],
)
def test_an_unpaired_surrogate_is_400_not_500(http: httpx.Client, fake: FakeInference, path: str, body: str) -> None:
    response = http.post(path, content=body, headers={"content-type": "application/json"})
    error = error_of(response, 400)
    assert error["code"] == "invalid_json" and "surrogate" in error["message"]
    assert fake.requests == []


def test_a_paired_surrogate_escape_is_just_a_character(http: httpx.Client) -> None:
    body = '{"model": "fake-model", "prompt": "smile \\ud83d\\ude00"}'
    assert http.post(COMPLETIONS, content=body, headers={"content-type": "application/json"}).status_code == 200


def test_more_choices_than_the_server_ever_queues_is_400(http: httpx.Client, fake: FakeInference) -> None:
    error = error_of(http.post(COMPLETIONS, json=completion_body(prompt=["a", "b"], n=60)), 400)
    assert error["param"] == "n" and "max_waiting_requests" in error["message"]
    assert fake.requests == []
