"""The gateway over a fake gRPC upstream: the parameters sent upstream, request ids, trace context, SSE framing,
logprobs formats, health, models, metrics, and client disconnects (which cancel the gRPC calls).
"""

from __future__ import annotations

import json
import re

import httpx
import openai
import pytest

from tests.unit.server.gateway.gateway_helpers import (
    CHAT,
    COMPLETIONS,
    FAKE_MODEL,
    FakeInference,
    FakeUpstream,
    LoopThread,
    RunningGateway,
    chat_body,
    completion_body,
    error_of,
    sse_data,
    wait_for,
)

# what reaches the model server


def test_sampling_parameters_reach_the_server(http: httpx.Client, fake: FakeInference) -> None:
    extras = {"top_k": 5, "min_p": 0.1, "repetition_penalty": 1.1, "min_tokens": 1, "ignore_eos": True,
              "stop_token_ids": [7], "skip_special_tokens": False, "speculative_tokens": 4, "priority": -3}  # fmt: skip
    body = completion_body(temperature=0.7, top_p=0.9, stop="\n", seed=5, n=3, presence_penalty=0.5,
                       frequency_penalty=-0.5, **extras)  # fmt: skip
    response = http.post(COMPLETIONS, json=body)
    assert [c["index"] for c in response.json()["choices"]] == [0, 1, 2]
    assert sorted(r.sampling.seed for r in fake.requests) == [5, 6, 7]  # the choices' streams start concurrently
    s = fake.requests[0].sampling
    assert (s.max_tokens, s.temperature, s.top_p, list(s.stop), s.top_k, s.min_tokens) == (3, 0.7, 0.9, ["\n"], 5, 1)
    assert (s.min_p, s.repetition_penalty, s.presence_penalty, s.frequency_penalty) == pytest.approx(
        (0.1, 1.1, 0.5, -0.5)
    )
    assert (list(s.stop_token_ids), s.ignore_eos, s.skip_special_tokens) == ([7], True, False)
    assert (s.speculative_tokens, s.priority) == (4, -3)
    assert not s.HasField("logprobs")


def test_unset_parameters_stay_unset(http: httpx.Client, fake: FakeInference) -> None:
    http.post(COMPLETIONS, json={"model": FAKE_MODEL, "prompt": "Hi"})
    s = fake.requests[0].sampling
    assert s.max_tokens == 16  # OpenAI's default for completions
    unset = ("temperature", "top_p", "seed", "top_k", "logprobs", "speculative_tokens", "priority")
    assert not any(s.HasField(f) for f in unset)


def test_prompts_and_token_ids(http: httpx.Client, fake: FakeInference) -> None:
    response = http.post(COMPLETIONS, json=completion_body(prompt=["a", "b"], n=2))
    assert [r.prompt for r in fake.requests] == ["a", "a", "b", "b"]
    usage = response.json()["usage"]
    assert usage["prompt_tokens"] == 2 * 5 and usage["completion_tokens"] == 4 * 3  # prompts once, choices each
    fake.requests.clear()
    http.post(COMPLETIONS, json=completion_body(prompt=[[1, 2], [3]]))
    assert [list(r.token_ids.ids) for r in fake.requests] == [[1, 2], [3]]


def test_chat_messages_and_max_tokens(http: httpx.Client, fake: FakeInference) -> None:
    messages = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    http.post(CHAT, json=chat_body(messages=messages, max_tokens=5, max_completion_tokens=2))
    request = fake.requests[-1]
    # "developer" goes upstream as it is: the server reads it as the system role
    assert [(m.role, m.content) for m in request.messages.messages] == [("developer", "Be brief."), ("user", "Hi")]
    assert request.sampling.max_tokens == 2  # max_completion_tokens wins over the deprecated max_tokens
    assert not request.sampling.max_tokens_from_context


def test_a_chat_without_max_tokens_is_one_upstream_call(http: httpx.Client, fake: FakeInference) -> None:
    """The model server fills in what the context leaves: no Tokenize round trip before the Generate."""
    num_generates, num_tokenizes = len(fake.requests), fake.num_tokenize_calls
    assert http.post(CHAT, json=chat_body()).status_code == 200
    assert (len(fake.requests) - num_generates, fake.num_tokenize_calls - num_tokenizes) == (1, 0)
    sampling = fake.requests[-1].sampling
    assert sampling.max_tokens_from_context and not sampling.HasField("max_tokens")


def test_request_id_passes_through(http: httpx.Client, fake: FakeInference) -> None:
    response = http.post(COMPLETIONS, json=completion_body(), headers={"X-Request-Id": "req-42"})
    assert response.headers["x-request-id"] == "req-42" and response.json()["id"] == "cmpl-req-42"
    assert fake.requests[-1].request_id == "req-42"
    response = http.post(CHAT, json=chat_body(n=2), headers={"X-Request-Id": "req-43"})
    assert sorted((r.request_id, r.choice_index) for r in fake.requests[-2:]) == [("req-43", 0), ("req-43", 1)]
    assert not any(r.HasField("choice_index") for r in fake.requests[:-2])  # one choice: none
    assert response.json()["id"] == "chatcmpl-req-43"
    generated = http.post(COMPLETIONS, json=completion_body(stream=True))
    assert (
        len(generated.headers["x-request-id"]) == 32
        and fake.requests[-1].request_id == generated.headers["x-request-id"]
    )
    error = http.post(COMPLETIONS, json=completion_body(prompt="status:INTERNAL"), headers={"X-Request-Id": "req-44"})
    assert error.headers["x-request-id"] == "req-44"
    assert (
        error_of(http.post(COMPLETIONS, json=completion_body(), headers={"X-Request-Id": "a b"}), 422)["param"]
        == "X-Request-Id"
    )


def test_an_empty_request_id_counts_as_absent(http: httpx.Client, fake: FakeInference) -> None:
    response = http.post(COMPLETIONS, json=completion_body(), headers={"X-Request-Id": ""})
    assert response.status_code == 200 and len(response.headers["x-request-id"]) == 32
    assert fake.requests[-1].request_id == response.headers["x-request-id"]


def test_a_request_id_sent_twice_is_400_before_any_upstream_call(http: httpx.Client, fake: FakeInference) -> None:
    headers = [("X-Request-Id", "first"), ("X-Request-Id", "second")]
    error = error_of(http.post(CHAT, json=chat_body(), headers=headers), 400)
    assert error["param"] == "X-Request-Id" and "sent 2 times" in error["message"]
    assert fake.requests == []


def test_trace_context_is_forwarded(http: httpx.Client, fake: FakeInference) -> None:
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    http.post(COMPLETIONS, json=completion_body(), headers={"traceparent": traceparent})
    assert fake.metadata[-1]["traceparent"] == traceparent


# response formats


def test_sse_framing_and_usage_chunk(http: httpx.Client) -> None:
    response = http.post(CHAT, json=chat_body(max_tokens=3, stream=True, stream_options={"include_usage": True}))
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_data(response)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1]) == "Hello world,"
    assert chunks[-2]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3
    assert all(c["usage"] is None for c in chunks[:-1])


def test_completion_logprobs_legacy_format(http: httpx.Client) -> None:
    choice = http.post(COMPLETIONS, json=completion_body(logprobs=2)).json()["choices"][0]
    lp = choice["logprobs"]
    assert lp["tokens"] == ["Hello", " world", ","]
    assert lp["token_logprobs"] == [-9999.0, -0.5, -0.5]  # -inf is clamped: JSON has no infinity
    assert lp["top_logprobs"][1] == {" world0": -0.5, " world1": -1.0}
    assert lp["text_offset"] == [0, 5, 11]
    streamed = sse_data(http.post(COMPLETIONS, json=completion_body(logprobs=2, stream=True)))
    offsets = [o for e in streamed[:-1] for o in json.loads(e)["choices"][0]["logprobs"]["text_offset"]]
    assert offsets == [0, 5, 11]


def test_chat_logprobs_format(http: httpx.Client, fake: FakeInference) -> None:
    choice = http.post(CHAT, json=chat_body(max_tokens=2, logprobs=True, top_logprobs=1)).json()["choices"][0]
    assert fake.requests[-1].sampling.logprobs == 1
    second = choice["logprobs"]["content"][1]
    assert second == {"token": " world", "logprob": -0.5, "bytes": list(b" world"),
                      "top_logprobs": [{"token": " world0", "logprob": -0.5, "bytes": list(b" world0")}]}  # fmt: skip
    http.post(CHAT, json=chat_body(max_tokens=2, logprobs=True))
    assert fake.requests[-1].sampling.logprobs == 0  # logprobs without top_logprobs: the sampled token's only
    assert http.post(CHAT, json=chat_body(max_tokens=2)).json()["choices"][0]["logprobs"] is None


# health, models, metrics


def test_health_follows_the_upstream(http: httpx.Client, upstream: FakeUpstream, loop: LoopThread) -> None:
    assert http.get("/health").json() == {"status": "ok", "upstream": "SERVING"}
    loop.call(upstream.set_serving(False))
    try:
        response = http.get("/health")
        assert response.status_code == 503 and response.json()["upstream"] == "NOT_SERVING"
    finally:
        loop.call(upstream.set_serving(True))


def test_models_via_the_openai_client(gateway: RunningGateway) -> None:
    client = openai.OpenAI(base_url=gateway.base_url, api_key="unused")
    assert [m.id for m in client.models.list()] == [FAKE_MODEL]


def _metrics(gateway: RunningGateway) -> str:
    """A scrape of the gateway's metrics port."""
    return httpx.get(f"http://127.0.0.1:{gateway.server.metrics_port}/metrics", timeout=10).text


def test_metrics_count_requests_by_status(gateway: RunningGateway, http: httpx.Client) -> None:
    http.post(COMPLETIONS, json=completion_body())
    http.post(COMPLETIONS, json=completion_body(prompt="status:RESOURCE_EXHAUSTED"))
    http.post(CHAT, json=chat_body(stream=True, max_tokens=2))
    text = _metrics(gateway)
    assert 'infer_gateway_requests_total{endpoint="/v1/completions",status="200"}' in text
    assert 'infer_gateway_requests_total{endpoint="/v1/completions",status="429"}' in text
    assert 'infer_gateway_time_to_first_token_seconds_count{endpoint="/v1/chat/completions"}' in text
    assert "infer_gateway_completion_tokens_total" in text and "infer_gateway_requests_in_flight" in text


def test_metrics_stay_off_the_public_http_port(gateway: RunningGateway, http: httpx.Client) -> None:
    assert http.get("/metrics").status_code == 404
    assert gateway.server.metrics_port not in (None, gateway.server.port)
    assert "infer_gateway_requests_in_flight" in _metrics(gateway)


def _upstream_errors(gateway: RunningGateway) -> dict[str, float]:
    lines = _metrics(gateway).splitlines()
    found = (re.match(r'infer_gateway_upstream_errors_total\{status="(\d+)"\} (\S+)', line) for line in lines)
    return {m.group(1): float(m.group(2)) for m in found if m}


def test_metrics_count_upstream_errors_by_status(gateway: RunningGateway, http: httpx.Client) -> None:
    before = _upstream_errors(gateway)
    http.post(COMPLETIONS, json=completion_body(prompt="status:UNAVAILABLE"))  # refused before the response
    http.post(COMPLETIONS, json=completion_body(prompt="fail-midway", stream=True))  # failed mid-stream
    http.post(COMPLETIONS, json=completion_body(model="no-such-model"))  # the gateway's own 404: not upstream
    after = _upstream_errors(gateway)
    assert after.get("503", 0) - before.get("503", 0) == 1
    assert after.get("500", 0) - before.get("500", 0) == 1
    assert "404" not in after


# client disconnects


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT])
def test_disconnect_mid_stream_cancels_the_grpc_calls(gateway: RunningGateway, fake: FakeInference, path: str) -> None:
    body = (
        completion_body(prompt="endless")
        if path == COMPLETIONS
        else chat_body(messages=[{"role": "user", "content": "endless"}])
    )
    request_id = f"gone-{path.count('/')}"
    with (
        httpx.Client(base_url=gateway.url, timeout=30) as http,
        http.stream(
            "POST", path, json=body | {"stream": True, "n": 2}, headers={"X-Request-Id": request_id}
        ) as response,
    ):
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
    wait_for(lambda: {f"{request_id}#0", f"{request_id}#1"} <= fake.cancelled)


def test_disconnect_while_waiting_cancels_the_grpc_call(gateway: RunningGateway, fake: FakeInference) -> None:
    with httpx.Client(base_url=gateway.url, timeout=0.3) as http, pytest.raises(httpx.ReadTimeout):
        http.post(COMPLETIONS, json=completion_body(prompt="endless"), headers={"X-Request-Id": "impatient"})
    wait_for(lambda: "impatient" in fake.cancelled)
