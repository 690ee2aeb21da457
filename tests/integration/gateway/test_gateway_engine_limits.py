"""The model server's input bounds and sampling floors, seen through the OpenAI gateway (HTTP), on the fake engine.

A chat over the message bound is a 400 that names the limit; a tiny temperature or repetition penalty
answers 200 with finite logprobs, never a 500 or a `NaN` in the stream.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.helpers.fake_engine import FakeRunner
from tests.integration.grpc_helpers import ServerThread, running_fake_server
from tests.unit.server.gateway.gateway_helpers import (
    error_of,
    first_model,
    sse_data,
)

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    with running_fake_server(max_model_len=256) as s:
        runner = s.engine.core.runner
        assert isinstance(runner, FakeRunner)
        runner.logit_offset = 20.0  # positive logits, as a real model's: a penalty divides them
        yield s


def _strict_json(text: str) -> Any:
    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in the JSON: {text[:200]}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("max_tokens", [4, None], ids=["max_tokens", "room-left"])  # None: the gateway tokenizes
def test_a_chat_over_the_message_bound_is_400_naming_it(http: httpx.Client, max_tokens: int | None) -> None:
    body: dict[str, Any] = {"model": first_model(http), "messages": [{"role": "user", "content": ""}] * 20_000}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    error = error_of(http.post(CHAT, json=body), 400)
    assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
    assert error["message"].startswith("messages: 20000 messages exceeds max_chat_messages (255; ")


def test_a_prompt_over_the_character_bound_is_400_naming_it(http: httpx.Client) -> None:
    body = {"model": first_model(http), "prompt": "x" * 5000, "max_tokens": 2}  # the bound: 16 x 255 characters
    error = error_of(http.post(COMPLETIONS, json=body), 400)
    assert error["code"] == "context_length_exceeded"
    assert error["message"].startswith("prompt: 5000 characters exceeds max_prompt_chars (4080; ")


def test_a_tiny_temperature_answers_like_greedy(http: httpx.Client) -> None:
    def text(temperature: float) -> str:
        body = {"model": first_model(http), "prompt": "Hello world", "max_tokens": 6, "temperature": temperature,
                "ignore_eos": True, "seed": 3}  # fmt: skip
        response = http.post(COMPLETIONS, json=body)
        assert response.status_code == 200, response.text
        return str(response.json()["choices"][0]["text"])

    assert text(1e-300) == text(0.0)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_tiny_repetition_penalty_gives_finite_logprobs(http: httpx.Client, stream: bool) -> None:
    body = {"model": first_model(http), "messages": [{"role": "user", "content": "Hello world, the capital"}],
            "max_tokens": 5, "repetition_penalty": 1e-300, "logprobs": True, "top_logprobs": 3, "stream": stream,
            "ignore_eos": True}  # fmt: skip
    response = http.post(CHAT, json=body)
    assert response.status_code == 200, response.text  # was 500 (whole) or a NaN in the stream
    if stream:
        chunks = [_strict_json(d) for d in sse_data(response) if d != "[DONE]"]
        entries = [e for c in chunks for ch in c["choices"] for e in (ch.get("logprobs") or {}).get("content") or []]
    else:
        entries = _strict_json(response.text)["choices"][0]["logprobs"]["content"]
    values = [v for e in entries for v in (e["logprob"], *(t["logprob"] for t in e["top_logprobs"]))]
    assert len(values) == 5 * 4 and all(math.isfinite(v) for v in values)
