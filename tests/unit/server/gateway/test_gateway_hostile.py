"""What a hostile client sends the gateway (issue 18): each gets a 4xx that says what is wrong, never a 500 with
internals, never a NaN in the JSON, never a log line per field name."""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import pytest

from infer.server.gateway.schemas import MAX_LOGGED_FIELDS, NUM_NAMES_PER_LINE, IgnoredFieldLog
from infer.server.security import ApiKeys
from tests.unit.server.gateway.gateway_helpers import (
    CHAT,
    COMPLETIONS,
    FakeInference,
    FakeUpstream,
    LoopThread,
    RunningGateway,
    chat_body,
    completion_body,
    error_of,
    running_gateway,
    sse_data,
)
from tests.unit.server.security_helpers import guarded

JSON = {"Content-Type": "application/json"}
DEEP = 10_000


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (COMPLETIONS, '{"model": "fake-model", "prompt": "Hi", "extra": %s}'),
        (COMPLETIONS, '{"model": "fake-model", "prompt": %s}'),
        (CHAT, '{"model": "fake-model", "messages": [{"role": "user", "content": %s}]}'),
    ],
)
def test_json_nested_thousands_deep_is_400(http: httpx.Client, fake: FakeInference, path: str, body: str) -> None:
    error = error_of(http.post(path, content=body % _nested(DEEP), headers=JSON), 400)
    assert error["code"] == "invalid_json" and "nested too deeply" in error["message"]
    assert fake.requests == []


# headers gRPC cannot carry: a tab, a latin-1 byte, UTF-8
BAD_HEADER_VALUES = [b"00-abc\tdef-01", b"caf\xe9", "trace-é".encode()]


@pytest.mark.parametrize("header", ["traceparent", "tracestate", "authorization"])
@pytest.mark.parametrize(
    ("path", "body"), [(COMPLETIONS, completion_body()), (CHAT, chat_body())]
)  # a chat without max_tokens asks the upstream to count its tokens first
def test_a_header_grpc_cannot_carry_is_dropped_not_a_500(
    http: httpx.Client, fake: FakeInference, header: str, path: str, body: dict[str, Any]
) -> None:
    for value in BAD_HEADER_VALUES:
        response = http.post(path, json=body, headers={header.encode(): value})
        assert response.status_code == 200, response.text
        assert header not in fake.metadata[-1]
    http.post(path, json=body, headers={header: "visible ASCII and spaces"})
    assert fake.metadata[-1][header] == "visible ASCII and spaces"


@pytest.mark.parametrize("header", ["traceparent", "tracestate", "authorization"])
def test_a_64_kib_forwarded_header_is_431_not_429(http: httpx.Client, fake: FakeInference, header: str) -> None:
    """gRPC refuses metadata this large RESOURCE_EXHAUSTED, which read as 429 "server busy": clients retried."""
    num_requests = len(fake.requests)
    for size in (65536, 10_000):  # the guard's bound on all headers; the one on those sent on as gRPC metadata
        error = error_of(http.post(COMPLETIONS, json=completion_body(), headers={header: "a" * size}), 431)
        assert error["code"] == "request_header_fields_too_large" and error["type"] == "invalid_request_error"
    assert header in error["message"] and len(fake.requests) == num_requests
    assert http.post(COMPLETIONS, json=completion_body(), headers={header: "a" * 3000}).status_code == 200


def test_a_64_kib_header_of_any_name_is_431(http: httpx.Client, fake: FakeInference) -> None:
    for path in ("/health", "/v1/models"):
        error = error_of(http.get(path, headers={"x-padding": "a" * 65536}), 431)
        assert "more than 32768 in all" in error["message"]


def test_a_dropped_authorization_meets_the_upstreams_key_check(loop: LoopThread) -> None:
    with (
        guarded(loop, keys=ApiKeys(["sk-1"])) as upstream,
        running_gateway(upstream.address, loop) as gateway,
        httpx.Client(base_url=gateway.url, timeout=30) as http,
    ):
        for path, body in ((COMPLETIONS, completion_body()), (CHAT, chat_body())):
            response = http.post(path, json=body, headers={b"authorization": b"Bearer sk-1\t\xe9"})
            assert error_of(response, 401)["code"] == "invalid_api_key"


def test_an_unexpected_error_is_500_without_internals(
    http: httpx.Client, gateway: RunningGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*args: Any) -> Any:
        raise RuntimeError("Failed execute_batch: <grpc._cython.cygrpc.SendInitialMetadataOperation at 0x7f30>")

    monkeypatch.setattr(gateway.server.app.state.upstream, "model_info", broken)
    error = error_of(http.post(CHAT, json=chat_body()), 500)
    assert error["code"] == "internal_error"
    assert "0x7f30" not in error["message"] and "RuntimeError" not in error["message"]


def test_the_longest_request_id_serves_any_number_of_choices(http: httpx.Client, fake: FakeInference) -> None:
    """The choices share the id and carry their index: no `-<i>` suffix to outgrow the bound."""
    headers = {"X-Request-Id": "r" * 128}
    assert http.post(COMPLETIONS, json=completion_body(n=11), headers=headers).status_code == 200
    assert {r.request_id for r in fake.requests} == {"r" * 128}
    assert sorted(r.choice_index for r in fake.requests) == list(range(11))


@pytest.mark.parametrize(
    ("path", "body", "param", "says"),
    [
        (CHAT, chat_body(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
         "messages[0].content[0]", "'image_url' parts are not supported"),
        (CHAT, chat_body(messages=[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "audio"}]}]),
         "messages[0].content[1]", "'audio' parts are not supported"),
        (CHAT, chat_body(messages=[{"role": "user", "content": [{"type": "text"}]}]),
         "messages[0].content[0].text", "Field required"),
        (COMPLETIONS, completion_body(prompt=[5, -1]), "prompt[1]", "greater than or equal to 0"),
        (COMPLETIONS, completion_body(prompt=[[1], [2, -3]]), "prompt[1][1]", "greater than or equal to 0"),
        (COMPLETIONS, completion_body(prompt=[2**31]), "prompt[0]", "less than 2147483648"),
    ],
)  # fmt: skip
def test_a_422_says_what_is_wrong(
    http: httpx.Client, fake: FakeInference, path: str, body: dict[str, Any], param: str, says: str
) -> None:
    error = error_of(http.post(path, json=body), 422)
    assert error["param"] == param and says in error["message"], error
    assert "valid string" not in error["message"]
    assert fake.requests == []


def test_a_flood_of_unknown_fields_logs_a_bounded_number_of_lines(
    upstream: FakeUpstream, loop: LoopThread, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="infer.server.gateway.schemas")
    body = chat_body(**{f"k{i}": 0 for i in range(50_000)})  # 0.6 MB, 50,000 names
    with running_gateway(upstream.address, loop) as gateway, httpx.Client(base_url=gateway.url, timeout=30) as http:
        for _ in range(MAX_LOGGED_FIELDS // NUM_NAMES_PER_LINE + 4):
            assert http.post(CHAT, json=body).status_code == 200
    records = [r for r in caplog.records if r.name == "infer.server.gateway.schemas"]
    assert len(records) == MAX_LOGGED_FIELDS // NUM_NAMES_PER_LINE + 1  # then one WARNING, then silence
    assert records[-1].levelno == logging.WARNING
    assert sum(r.getMessage().count("'k") for r in records) == MAX_LOGGED_FIELDS


def test_the_unknown_field_log_remembers_a_bounded_set() -> None:
    log = IgnoredFieldLog(capacity=10)
    log.log("/v1/chat/completions", (f"name-{i}-" + "x" * 10_000 for i in range(1000)))
    log.log("/v1/chat/completions", (f"other-{i}" for i in range(1000)))
    assert len(log.names) == 10 and all(len(name) < 100 for name in log.names)


NAN_BODIES = [
    (COMPLETIONS, completion_body(prompt="nan-logprobs", logprobs=1)),
    (CHAT, chat_body(messages=[{"role": "user", "content": "nan-logprobs"}], max_tokens=3, logprobs=True,
                     top_logprobs=1)),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body"), NAN_BODIES)
def test_nan_logprobs_never_reach_the_json(http: httpx.Client, path: str, body: dict[str, Any]) -> None:
    whole = http.post(path, json=body)
    assert whole.status_code == 200 and "NaN" not in whole.text, whole.text
    logprobs = whole.json()["choices"][0]["logprobs"]
    values = logprobs["token_logprobs"] if path == COMPLETIONS else [t["logprob"] for t in logprobs["content"]]
    assert values == [-9999.0] * 3
    events = sse_data(http.post(path, json=body | {"stream": True}))
    assert events[-1] == "[DONE]" and "NaN" not in "".join(events)
    assert all("error" not in json.loads(e) for e in events[:-1])
