"""The hostile phase of `make soak` (issue 18): clients that send what a hostile client would, mixed into the normal
traffic. Each returns its outcome; EXPECTED says which outcomes are right for each kind.

JSON nested 10,000 deep, 50,000 unknown keys, header bytes gRPC cannot carry, a cross-site text/plain POST, sampling
values that underflow float32, chats of 5,000 messages, request headers that never finish, an idle socket on the
metrics port.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass

import grpc
import httpx

from infer.api import pb, pb_grpc

EXPECTED = {
    "deep_json": {"400"}, "key_flood": {"200"}, "bad_headers": {"200"}, "cross_site": {"403"},
    "tiny_floats": {"200", "422"}, "huge_chat": {"400", "422"}, "grpc_huge_chat": {"INVALID_ARGUMENT"},
    "grpc_tiny_floats": {"OK", "INVALID_ARGUMENT"}, "slow_headers": {"408"}, "metrics_idle": {"closed"},
}  # fmt: skip
KINDS = tuple(EXPECTED)
NUM_HUGE_MESSAGES = 5000
NUM_FLOOD_KEYS = 50_000
DEPTH = 10_000
HELD_S = 30.0  # a socket the server has not closed after this is "held"
JSON = {"Content-Type": "application/json"}


@dataclass(frozen=True)
class Doors:
    """Where the server listens."""

    host: str
    http_port: int
    metrics_port: int
    model: str = "SmolLM2-135M-Instruct"


def _tiny_floats(rng: random.Random) -> dict[str, float]:
    names = rng.sample(["temperature", "repetition_penalty", "top_p", "min_p"], rng.randint(1, 3))
    return {name: rng.choice([1e-300, 5e-324, 1e-45, 1e-38]) for name in names}


async def _http(http: httpx.AsyncClient, kind: str, rng: random.Random, model: str) -> str:
    body: dict[str, object] = {"model": model, "prompt": "The capital of France is", "max_tokens": 4}
    content, headers = None, dict(JSON)
    if kind == "deep_json":
        content = json.dumps(body)[:-1] + ', "extra": ' + "[" * DEPTH + "]" * DEPTH + "}"
    elif kind == "key_flood":
        body |= {f"k{rng.randrange(10**9)}-{i}": 0 for i in range(NUM_FLOOD_KEYS)}
    elif kind == "bad_headers":
        headers |= {"traceparent": "00-\t-01", "tracestate": "caf\xe9=1"}  # a tab; a latin-1 byte
    elif kind == "cross_site":
        headers = {"Content-Type": "text/plain", "Origin": "http://evil.example"}
    elif kind == "tiny_floats":
        body |= _tiny_floats(rng) | {"logprobs": 2, "stream": rng.random() < 0.5}
    elif kind == "huge_chat":
        body = {"model": model, "messages": [{"role": "user", "content": ""}] * NUM_HUGE_MESSAGES}
    path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
    raw_headers = {k: v.encode("latin-1") for k, v in headers.items()}
    response = await http.post(path, content=(content or json.dumps(body)).encode(), headers=raw_headers)
    return "NaN" if "NaN" in response.text else str(response.status_code)


async def _grpc(stub: pb_grpc.InferenceServiceStub, kind: str, rng: random.Random) -> str:
    if kind == "grpc_huge_chat":
        messages = pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="")] * NUM_HUGE_MESSAGES)
        request = pb.GenerateRequest(messages=messages, sampling=pb.SamplingParams(max_tokens=4))
    else:
        sampling = pb.SamplingParams(max_tokens=8, logprobs=2, **_tiny_floats(rng))
        request = pb.GenerateRequest(prompt="The capital of France is", sampling=sampling)
    try:
        async for response in stub.Generate(request, timeout=120):
            if any(lp.logprob != lp.logprob for lp in response.logprobs):  # NaN
                return "NaN"
        return "OK"
    except grpc.aio.AioRpcError as e:
        return str(e.code().name)


async def _socket(host: str, port: int, head: bytes) -> str:
    """Send part of a request (or nothing) and wait: the server must answer 408 or close."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(head)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), HELD_S)
    except TimeoutError:
        return "held"
    except ConnectionError:
        return "closed"
    finally:
        writer.close()
    if not data:
        return "closed"
    return data.split(b" ", 2)[1].decode("ascii", "replace") if data.startswith(b"HTTP/") else "garbage"


async def hostile_client(
    http: httpx.AsyncClient, stub: pb_grpc.InferenceServiceStub, doors: Doors, kind: str, rng: random.Random
) -> str:
    """One hostile request of `kind`; its outcome (an HTTP status, a gRPC code, closed / held / NaN)."""
    if kind.startswith("grpc_"):
        return await _grpc(stub, kind, rng)
    if kind == "slow_headers":
        return await _socket(doors.host, doors.http_port, b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    if kind == "metrics_idle":
        return await _socket(doors.host, doors.metrics_port, b"")
    return await _http(http, kind, rng, doors.model)
