"""Issue 18's classes of hostile input, fuzzed at both front doors: the answer is a 4xx (or a gRPC refusal) that says
what is wrong, or a normal answer; never a 5xx, a traceback, internals in a message, a NaN in the JSON, more than
one log line per request about unknown fields, or a leaked KV block.

`make test` runs a short pass (the `ci` profile); `make fuzz` a long one (`--hypothesis-profile=fuzz`).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from infer.api import pb, pb_grpc
from tests.fuzz.hostile import (
    RawBody,
    extreme_float_requests,
    grpc_metadata,
    hostile_headers,
    huge_message_requests,
    raw_bodies,
)
from tests.fuzz.strategies import chat_bodies, completion_bodies
from tests.integration.grpc_helpers import ServerThread, running_fake_server

pytestmark = pytest.mark.fuzz
MODEL = "fake"
HTTP_STATUSES = {200, 400, 403, 404, 409, 413, 415, 422, 429}
REFUSALS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED}
INTERNALS = ("Traceback", "object at 0x", "_cython")  # what an error message must never show
# NOTE: an example here is a body of up to 4 MB or a chat of 30,000 messages: a fifth of the profile's count keeps
# `make fuzz` within pytest's per-test timeout on a busy 2-core machine
HEAVY = settings(max_examples=max(60, settings.default.max_examples // 5))


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    with running_fake_server(max_model_len=256, max_num_seqs=8, max_waiting_requests=16) as s:
        yield s


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """The gateway's logs; no ERROR (a 500's traceback) may appear."""
    caplog.set_level(logging.INFO, logger="infer.server.gateway")
    yield caplog
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def _strict_json(text: str) -> Any:
    def refuse(token: str) -> Any:
        raise AssertionError(f"{token} in the JSON: {text[:300]}")

    return json.loads(text, parse_constant=refuse)


def _check(response: httpx.Response, stream: bool) -> None:
    event(f"HTTP {response.status_code}")
    assert response.status_code in HTTP_STATUSES, (response.status_code, response.text[:500])
    if response.status_code != 200:
        error = _strict_json(response.text)["error"]
        assert error["message"] and error["type"], error
        assert not any(word in error["message"] for word in INTERNALS), error
    elif stream:
        events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        for e in events[:-1]:
            assert "error" not in _strict_json(e), e
    else:
        assert _strict_json(response.text)["choices"]


def _num_field_lines(logs: pytest.LogCaptureFixture) -> int:
    return sum(r.name == "infer.server.gateway.schemas" for r in logs.records)


@HEAVY
@given(raw=raw_bodies(MODEL))
def test_hostile_bodies_get_an_answer_or_a_4xx(
    server: ServerThread, http: httpx.Client, logs: pytest.LogCaptureFixture, raw: RawBody
) -> None:
    event(raw.kind)
    num_lines = _num_field_lines(logs)
    response = http.post(raw.path, content=raw.body, headers={"Content-Type": "application/json"})
    _check(response, raw.stream)
    assert _num_field_lines(logs) - num_lines <= 1, "one line per request about unknown fields, at most"
    server.wait_idle()


VALID_BODIES = st.sampled_from([
    {"model": MODEL, "prompt": "Hello", "max_tokens": 3},
    {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}]},  # no max_tokens: the server fills it in
    {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 3, "stream": True},
])  # fmt: skip


@given(headers=hostile_headers(), body=VALID_BODIES | chat_bodies(MODEL) | completion_bodies(MODEL))
def test_hostile_headers_get_an_answer_or_a_4xx(
    server: ServerThread, http: httpx.Client, logs: pytest.LogCaptureFixture, headers: dict[bytes, bytes], body: Any
) -> None:
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    for name in headers:
        event(f"header {name.decode()}")
    headers = {b"content-type": b"application/json"} | headers
    response = http.post(path, content=json.dumps(body).encode(), headers=headers)
    _check(response, body.get("stream") is True and response.status_code == 200)
    server.wait_idle()


def _generate(stub: pb_grpc.InferenceServiceStub, request: pb.GenerateRequest, metadata: Any = ()) -> None:
    error: grpc.RpcError | None = None
    try:
        responses = list(stub.Generate(request, timeout=60, metadata=metadata))
    except grpc.RpcError as e:
        error = e
    event("OK" if error is None else error.code().name)
    if error is not None:
        assert error.code() in REFUSALS and error.details(), (error.code(), error.details())
        return
    assert responses and responses[-1].finish_reason in (pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH)
    logprobs = [lp.logprob for r in responses for lp in r.logprobs]
    assert not any(math.isnan(x) for x in logprobs), logprobs  # tiny sampling values included (finding 4)


@HEAVY
@given(request=huge_message_requests() | extreme_float_requests(), metadata=grpc_metadata())
def test_hostile_generate_requests_are_served_or_refused(
    server: ServerThread, stub: pb_grpc.InferenceServiceStub, request: pb.GenerateRequest, metadata: Any
) -> None:
    _generate(stub, request, metadata)
    server.wait_idle()
