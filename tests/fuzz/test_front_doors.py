"""Every input to either front door gets a valid answer or a proper error: no UNKNOWN or INTERNAL, no 5xx,
no leaked KV block, and the server still serves afterwards. Served over the fake engine (no weights).

`make test` runs a short pass (the `ci` profile); `make fuzz` a long one (`--hypothesis-profile=fuzz`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pytest
from hypothesis import event, given

from infer.api import pb, pb_grpc
from tests.fuzz.strategies import chat_bodies, completion_bodies, generate_requests
from tests.integration.grpc_helpers import ServerThread, running_fake_server

pytestmark = pytest.mark.fuzz
REFUSALS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED}
MODEL = "fake"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    with running_fake_server(max_model_len=256, max_num_seqs=8, max_waiting_requests=16) as s:
        yield s


def _check_stream(responses: list[pb.GenerateResponse]) -> None:
    assert responses, "a stream ends with a final message"
    final = responses[-1]
    assert final.finish_reason in (pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH)
    assert final.usage.completion_tokens == sum(len(r.token_ids) for r in responses)


@given(request=generate_requests(hostile=False))
def test_valid_requests_are_served(server: ServerThread, stub: pb_grpc.InferenceServiceStub, request: Any) -> None:
    _check_stream(list(stub.Generate(request, timeout=30)))
    server.wait_idle()


@given(request=generate_requests(hostile=True))
def test_generate_answers_or_refuses(server: ServerThread, stub: pb_grpc.InferenceServiceStub, request: Any) -> None:
    error: grpc.RpcError | None = None
    try:
        responses = list(stub.Generate(request, timeout=30))
    except grpc.RpcError as e:
        error = e
    event("OK" if error is None else error.code().name)
    if error is None:
        _check_stream(responses)
    else:
        assert error.code() in REFUSALS and error.details(), (error.code(), error.details())
    server.wait_idle()


def _check_http(response: httpx.Response, stream: bool) -> None:
    event(f"HTTP {response.status_code}")
    assert response.status_code in (200, 400, 404, 409, 413, 422, 429), (response.status_code, response.text)
    if response.status_code != 200:
        error = response.json()["error"]
        assert error["message"] and error["type"]
    elif stream:
        events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        assert all("error" not in json.loads(e) for e in events[:-1]), events
    else:
        assert response.json()["choices"]


@given(body=completion_bodies(MODEL))
def test_completions_answer_or_refuse(server: ServerThread, http: httpx.Client, body: dict[str, Any]) -> None:
    _check_http(http.post("/v1/completions", json=body), body.get("stream") is True)
    server.wait_idle()


@given(body=chat_bodies(MODEL))
def test_chat_completions_answer_or_refuse(server: ServerThread, http: httpx.Client, body: dict[str, Any]) -> None:
    _check_http(http.post("/v1/chat/completions", json=body), body.get("stream") is True)
    server.wait_idle()


def test_the_server_still_serves(stub: pb_grpc.InferenceServiceStub, server: ServerThread) -> None:
    request = pb.GenerateRequest(prompt="Hello", sampling=pb.SamplingParams(max_tokens=3, ignore_eos=True))
    _check_stream(list(stub.Generate(request, timeout=30)))
    server.wait_idle()
