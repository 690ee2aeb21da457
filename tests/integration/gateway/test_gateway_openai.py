"""The official `openai` client against the gateway, in front of the default-model gRPC server.

Greedy streams equal whole responses, usage is right, n choices, logprobs, raw SSE framing, and a client
that leaves mid-stream frees its request and KV blocks in the engine.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import openai
import pytest

from tests.integration.grpc_helpers import ServerThread
from tests.unit.server.gateway.gateway_helpers import RunningGateway

PROMPT = "The capital of France is"
QUESTION: list[Any] = [{"role": "user", "content": "What is the capital of France?"}]
IGNORE_EOS = {"ignore_eos": True}


def test_models_lists_the_served_model(client: openai.OpenAI, grpc_server: ServerThread) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == [grpc_server.engine.model_info.model_id]
    assert client.models.retrieve(models[0].id).id == models[0].id


def test_health_reflects_the_grpc_server(gateway: RunningGateway) -> None:
    response = httpx.get(f"{gateway.url}/health")
    assert response.status_code == 200 and response.json()["upstream"] == "SERVING"


def test_completion_stream_equals_the_whole_response(
    client: openai.OpenAI, model: str, grpc_server: ServerThread
) -> None:
    args: dict[str, Any] = {
        "model": model,
        "prompt": PROMPT,
        "max_tokens": 12,
        "temperature": 0,
        "extra_body": IGNORE_EOS,
    }
    whole = client.completions.create(**args)
    chunks = list(client.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text and text.strip()
    assert whole.choices[0].finish_reason == "length" == [c for c in chunks if c.choices][-1].choices[0].finish_reason
    num_prompt_tokens = len(grpc_server.engine.core.tokenizer.encode(PROMPT))
    for usage in (whole.usage, chunks[-1].usage):
        assert usage is not None
        assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (
            num_prompt_tokens, 12, num_prompt_tokens + 12
        )  # fmt: skip


def test_chat_with_the_async_client(gateway: RunningGateway, model: str) -> None:
    async def main() -> tuple[Any, str, Any, list[str | None]]:
        async with openai.AsyncOpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0) as client:
            args: dict[str, Any] = {"model": model, "messages": QUESTION, "max_tokens": 16, "temperature": 0}
            whole = await client.chat.completions.create(**args)
            stream = await client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True})
            parts, reasons, usage = [], [], None
            async for chunk in stream:
                usage = chunk.usage or usage
                for choice in chunk.choices:
                    parts.append(choice.delta.content or "")
                    reasons.append(choice.finish_reason)
            return whole, "".join(parts), usage, reasons

    whole, text, usage, reasons = asyncio.run(main())
    answer = whole.choices[0].message
    assert answer.role == "assistant" and answer.content.strip() == "The capital of France is Paris."
    assert whole.choices[0].finish_reason == "stop" and reasons[-1] == "stop"
    assert text == answer.content
    assert usage.completion_tokens == whole.usage.completion_tokens and usage.prompt_tokens == whole.usage.prompt_tokens


def test_n_choices(client: openai.OpenAI, model: str, grpc_server: ServerThread) -> None:
    prompt = "Once upon a time"
    whole = client.completions.create(model=model, prompt=prompt, max_tokens=6, n=2, temperature=1.0, seed=7,
                                      extra_body=IGNORE_EOS)  # fmt: skip
    assert [c.index for c in whole.choices] == [0, 1] and all(c.text for c in whole.choices)
    assert whole.usage is not None and whole.usage.completion_tokens == 2 * 6
    assert whole.usage.prompt_tokens == len(grpc_server.engine.core.tokenizer.encode(prompt))  # once, not per choice
    stream = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=6, n=2, stream=True, seed=1)
    texts: list[str] = ["", ""]
    reasons: list[str | None] = [None, None]
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            reasons[choice.index] = choice.finish_reason or reasons[choice.index]
    assert all(texts) and all(r in ("stop", "length") for r in reasons)


def test_logprobs(client: openai.OpenAI, model: str) -> None:
    completion = client.completions.create(model=model, prompt=PROMPT, max_tokens=4, temperature=0, logprobs=3,
                                           extra_body=IGNORE_EOS)  # fmt: skip
    lp = completion.choices[0].logprobs
    assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs and lp.text_offset is not None
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert "".join(lp.tokens) == completion.choices[0].text
    for value, top in zip(lp.token_logprobs, lp.top_logprobs, strict=True):
        assert value <= 0 and len(top) == 3 and max(top.values()) == pytest.approx(value)  # greedy: the best one
    chat = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=3, temperature=0, logprobs=True,
                                          top_logprobs=2)  # fmt: skip
    assert chat.choices[0].logprobs is not None
    content = chat.choices[0].logprobs.content
    assert content is not None and len(content) == 3
    assert "".join(t.token for t in content) == chat.choices[0].message.content
    for token in content:
        assert bytes(token.bytes or []).decode() == token.token and len(token.top_logprobs) == 2
        assert token.top_logprobs[0].token == token.token  # greedy


def test_raw_sse_framing(gateway: RunningGateway, model: str) -> None:
    body = {"model": model, "prompt": PROMPT, "max_tokens": 5, "temperature": 0, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{gateway.url}/v1/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = response.read().decode()
    assert raw.endswith("data: [DONE]\n\n")
    events = raw.split("\n\n")[:-1]
    assert all(e.startswith("data: ") and "\n" not in e for e in events)
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert (
        all(c["object"] == "text_completion" for c in chunks) and chunks[-1]["choices"][0]["finish_reason"] == "length"
    )


def _span(server: ServerThread, request_id: str, timeout_s: float = 10) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for span in server.spans.get_finished_spans():
            if span.attributes and span.attributes.get("infer.request_id") == request_id:
                return span
        time.sleep(0.02)
    raise AssertionError(f"no span for {request_id}")


def _assert_aborted(server: ServerThread, request_id: str, max_tokens: int) -> None:
    started_s = time.monotonic()
    server.wait_idle()  # the engine holds no request and leaks no KV block
    assert time.monotonic() - started_s < 5, "the request ran on after its client left"
    span = _span(server, request_id)
    assert span.attributes["rpc.grpc.status_code"] == "CANCELLED"
    assert span.attributes["infer.completion_tokens_streamed"] < max_tokens


def test_disconnect_mid_stream_frees_the_request(
    gateway: RunningGateway, model: str, grpc_server: ServerThread
) -> None:
    request_id, max_tokens = "gateway-gone-mid-stream", 400
    body = {"model": model, "prompt": "Count: 1, 2, 3,", "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True}  # fmt: skip
    headers = {"X-Request-Id": request_id}
    with httpx.stream("POST", f"{gateway.url}/v1/completions", json=body, headers=headers, timeout=60) as response:
        assert response.headers["x-request-id"] == request_id
        events = (line for line in response.iter_lines() if line.startswith("data: "))
        for _ in range(3):
            next(events)
    _assert_aborted(grpc_server, request_id, max_tokens)


def test_disconnect_while_generating_frees_the_request(
    gateway: RunningGateway, model: str, grpc_server: ServerThread
) -> None:
    request_id, max_tokens = "gateway-gone-waiting", 400
    body = {"model": model, "messages": QUESTION, "max_tokens": max_tokens, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers={"X-Request-Id": request_id}, timeout=1.0)
    _assert_aborted(grpc_server, request_id, max_tokens)


def test_a_chat_without_max_tokens_renders_its_template_once(
    client: openai.OpenAI, model: str, grpc_server: ServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One Generate call: the server renders the chat once and fills in max_tokens from the context left."""
    tokenizer = grpc_server.engine.core.tokenizer
    render = tokenizer.apply_chat_template
    renders: list[int] = []
    monkeypatch.setattr(tokenizer, "apply_chat_template", lambda *a, **k: renders.append(1) or render(*a, **k))
    chat = client.chat.completions.create(model=model, messages=QUESTION, temperature=0)
    assert chat.choices[0].message.content and chat.choices[0].finish_reason == "stop"
    assert len(renders) == 1
