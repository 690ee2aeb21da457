"""The hostile phase of `make soak` (issue 18): clients that send what a hostile client would, mixed into the normal
traffic. Each returns its outcome; EXPECTED says which outcomes are right for each kind.

JSON nested 10,000 deep, 50,000 unknown keys, header bytes gRPC cannot carry, a cross-site text/plain POST, sampling
values that underflow float32, chats of 5,000 messages, request headers that never finish, an idle socket on the
metrics port; and issue 27's: JSON schemas that take minutes to compile, sent by callers that leave within seconds;
JSON schemas with length-bounded, pattern and enum strings under prompts that invite control characters (the
output must parse and validate); schemas with keywords that would not be enforced or remote `$ref`s (400 naming
them, nothing fetched); tools with invalid parameters under every tool_choice; `n` > 1 beside a look-alike id,
X-Request-Id sent twice or empty; scrapes while 40 idle sockets sit on the metrics port.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import re
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import jsonschema

from infer.api import pb, pb_grpc

EXPECTED = {
    "deep_json": {"400"}, "key_flood": {"200"}, "bad_headers": {"200"}, "cross_site": {"403"},
    "tiny_floats": {"200", "422"}, "huge_chat": {"400", "422"}, "grpc_huge_chat": {"INVALID_ARGUMENT"},
    "grpc_tiny_floats": {"OK", "INVALID_ARGUMENT"}, "slow_headers": {"408"}, "metrics_idle": {"closed"},
    # issue 27: a compile past its budget is refused for time (remembered), or its caller left first
    "grammar_slow": {"left", "refused_for_time", "queue_full"},
    "grpc_grammar_slow": {"DEADLINE_EXCEEDED", "refused_for_time", "queue_full"},
    "json_strings": {"valid", "max_tokens"}, "grpc_json_strings": {"valid", "max_tokens"},
    "schema_refused": {"400"}, "tool_invalid": {"400"},
    "ids_n": {"200"}, "ids_twice": {"400"}, "ids_empty": {"200"}, "metrics_scrape_idle": {"scraped"},
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
    listener_port: int = 0  # where the remote $refs point: nothing may ever connect


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
    """One hostile request of `kind`; its outcome (an HTTP status, a gRPC code, closed / held / NaN, ...)."""
    if kind in ISSUE_27:
        return await ISSUE_27[kind](http, stub, doors, rng)
    if kind.startswith("grpc_"):
        return await _grpc(stub, kind, rng)
    if kind == "slow_headers":
        return await _socket(doors.host, doors.http_port, b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    if kind == "metrics_idle":
        return await _socket(doors.host, doors.metrics_port, b"")
    return await _http(http, kind, rng, doors.model)


# --- issue 27

NUM_SLOW_PROPERTIES = 1800  # ~64 KB: ~68 s to compile on the default model's vocabulary, past any default budget
SLOW_SCHEMAS = 4  # a small pool, so that later callers meet a refusal already remembered (or a compile under way)
_slow_nonce = random.Random().randrange(16**4)  # NOTE: fresh schemas each run: a server remembers refusals


def _slow_schema(rng: random.Random) -> str:
    which = rng.randrange(SLOW_SCHEMAS)
    names = [f"{_slow_nonce:x}{which}{i}" for i in range(NUM_SLOW_PROPERTIES)]  # NOTE: short: 65,536 characters at most
    schema = {"type": "object", "properties": {n: {"type": "integer"} for n in names}, "required": names[:1]}
    return json.dumps(schema, separators=(",", ":"))


def _refusal(status_or_code: str, message: str) -> str:
    if "grammar_compile_budget_s" in message:
        return "refused_for_time"
    if "max_pending_grammars" in message or "too slow now" in message:
        return "queue_full"
    return f"{status_or_code}: {message[:80]}"


async def _grammar_slow(http: httpx.AsyncClient, _: Any, doors: Doors, rng: random.Random) -> str:
    """A schema that takes a minute to compile, from a caller that leaves after 0.2-3 s."""
    body = {"model": doors.model, "messages": [{"role": "user", "content": "Fill it in."}], "max_tokens": 8,
            "response_format": {"type": "json_schema", "json_schema": {"name": "slow", "schema": json.loads(
                _slow_schema(rng))}}}  # fmt: skip
    try:
        response = await http.post("/v1/chat/completions", json=body, timeout=rng.uniform(0.2, 3.0))
    except httpx.TimeoutException:
        return "left"
    return _refusal(str(response.status_code), response.json().get("error", {}).get("message", response.text))


async def _grpc_grammar_slow(_: Any, stub: pb_grpc.InferenceServiceStub, doors: Doors, rng: random.Random) -> str:
    sampling = pb.SamplingParams(max_tokens=8, json_schema=_slow_schema(rng))
    try:
        async for _ in stub.Generate(pb.GenerateRequest(prompt="{", sampling=sampling), timeout=rng.uniform(0.2, 3.0)):
            pass
    except grpc.aio.AioRpcError as e:
        return "DEADLINE_EXCEEDED" if e.code() is grpc.StatusCode.DEADLINE_EXCEEDED else _refusal(
            str(e.code().name), str(e.details()))  # fmt: skip
    return "OK"


# strings with maxLength, pattern, enum and format (the pool is small: each compiles once, then is cached)
STRING_SCHEMAS = [
    {"type": "object", "properties": {"line": {"type": "string", "maxLength": 24},
                                      "cols": {"type": "array", "items": {"type": "string", "maxLength": 6},
                                               "maxItems": 4}},
     "required": ["line", "cols"], "additionalProperties": False},
    {"type": "object", "properties": {"sep": {"type": "string", "enum": ["\t", ",", ";", "\u0001", '"']},
                                      "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
                                      "when": {"type": "string", "format": "date"}},
     "required": ["sep", "code", "when"], "additionalProperties": False},
    {"type": "object", "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 12},
                                      "note": {"type": "string", "maxLength": 16}},
     "required": ["name", "note"], "additionalProperties": False},
]  # fmt: skip
INVITING = [
    "Copy this tab-separated line exactly, tabs included: name\tage\tcity\x01",
    'Repeat with its escapes: a\tb\\c"d \u0009 and a raw tab:\t.',
    "Echo these bytes: \x00\x01\x1b[31mred\x1b[0m\r\n",
]


def _json_outcome(text: str, finished: bool, schema: dict[str, Any]) -> str:
    if any(ord(c) < 0x20 for c in text):
        return "raw_control_character"
    if not finished:
        return "max_tokens"
    try:
        jsonschema.validate(json.loads(text), schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    except (ValueError, jsonschema.ValidationError) as e:
        return f"INVALID: {str(e)[:60]}"
    return "valid"


async def _json_strings(http: httpx.AsyncClient, _: Any, doors: Doors, rng: random.Random) -> str:
    schema = rng.choice(STRING_SCHEMAS)
    response_format = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    body = {"model": doors.model, "messages": [{"role": "user", "content": rng.choice(INVITING)}], "max_tokens": 64,
            "temperature": 1.5, "response_format": response_format}  # fmt: skip
    response = await http.post("/v1/chat/completions", json=body)
    if response.status_code != 200:
        return str(response.status_code)
    choice = response.json()["choices"][0]
    return _json_outcome(choice["message"]["content"], choice["finish_reason"] == "stop", schema)


async def _grpc_json_strings(_: Any, stub: pb_grpc.InferenceServiceStub, doors: Doors, rng: random.Random) -> str:
    schema = rng.choice(STRING_SCHEMAS)
    sampling = pb.SamplingParams(max_tokens=64, temperature=1.5, json_schema=json.dumps(schema))
    messages = pb.ChatMessages(messages=[pb.ChatMessage(role="user", content=rng.choice(INVITING))])
    text, finished = "", False
    try:
        async for response in stub.Generate(pb.GenerateRequest(messages=messages, sampling=sampling), timeout=300):
            text += response.text
            finished = response.finish_reason == pb.FINISH_REASON_STOP
    except grpc.aio.AioRpcError as e:
        return str(e.code().name)
    return _json_outcome(text, finished, schema)


def _refused_schema(rng: random.Random, doors: Doors) -> tuple[dict[str, Any], str]:
    """A schema with a keyword that would not be enforced, or a remote $ref; what its refusal must name."""
    ref = rng.choice([f"http://{doors.host}:{doors.listener_port}/s.json", "https://example.com/x.json#/a",
                      "http://169.254.169.254/latest/meta-data"])  # fmt: skip
    spoiled, named = rng.choice([({"not": {"type": "integer"}}, "not is not enforced"),
                                 ({"$ref": ref}, f"$ref {ref!r} is a remote reference"),
                                 ({"uniqueItems": True}, "uniqueItems is not enforced"),
                                 ({"if": {"type": "string"}, "then": {"type": "string"}}, "if/then/else")])  # fmt: skip
    if rng.random() < 0.5:
        return {"type": "object", "properties": {"a": spoiled}}, f"#/properties/a: {named}"
    return {"type": "object", **spoiled} if "$ref" not in spoiled else spoiled, f"#: {named}"


async def _schema_refused(http: httpx.AsyncClient, _: Any, doors: Doors, rng: random.Random) -> str:
    schema, named = _refused_schema(rng, doors)
    body = {"model": doors.model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
            "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}}  # fmt: skip
    response = await http.post("/v1/chat/completions", json=body)
    message = response.json().get("error", {}).get("message", "") if response.status_code != 200 else ""
    return "400" if response.status_code == 400 and named in message else f"{response.status_code}: {message[:80]}"


async def _tool_invalid(http: httpx.AsyncClient, _: Any, doors: Doors, rng: random.Random) -> str:
    bad = rng.randrange(3)
    schema, _ = _refused_schema(rng, doors)
    good = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}}
    tools = [{"type": "function", "function": {"name": f"t{i}", "parameters": schema if i == bad else good}}
             for i in range(3)]  # fmt: skip
    named = {"type": "function", "function": {"name": f"t{rng.randrange(3)}"}}
    choice = rng.choice(["auto", "none", "required", None, named])
    body: dict[str, Any] = {"model": doors.model, "messages": [{"role": "user", "content": "Weather?"}],
                            "max_tokens": 4, "tools": tools}  # fmt: skip
    if choice is not None:
        body["tool_choice"] = choice
    response = await http.post("/v1/chat/completions", json=body)
    param = response.json().get("error", {}).get("param") if response.status_code != 200 else None
    return "400" if response.status_code == 400 and param == f"tools[{bad}].function.parameters" else (
        f"{response.status_code}: {param}")  # fmt: skip


_ids = itertools.count()


async def _ids_n(http: httpx.AsyncClient, _: Any, doors: Doors, rng: random.Random) -> str:
    """n choices beside another client whose id looks like a choice's: both served, neither 409."""
    request_id = f"soak-{rng.randrange(10**9)}-{next(_ids)}"
    body = {"model": doors.model, "prompt": "The capital of France is", "max_tokens": 4}
    choices, other = await asyncio.gather(
        http.post("/v1/completions", json=body | {"n": 3}, headers={"X-Request-Id": request_id}),
        http.post("/v1/completions", json=body, headers={"X-Request-Id": f"{request_id}-1"}),
    )
    if choices.status_code != 200 or other.status_code != 200:
        return f"{choices.status_code}+{other.status_code}"
    indexes = sorted(c["index"] for c in choices.json()["choices"])
    is_right = choices.json()["id"] == f"cmpl-{request_id}" and indexes == [0, 1, 2]
    return "200" if is_right and other.json()["id"] == f"cmpl-{request_id}-1" else "200: wrong ids"


async def _ids_twice(http: httpx.AsyncClient, _: Any, doors: Doors, rng: random.Random) -> str:
    headers = [("X-Request-Id", f"a{rng.randrange(1000)}"), ("X-Request-Id", rng.choice(["", "b", "a"]))]
    body = {"model": doors.model, "prompt": "Hello", "max_tokens": 2}
    response = await http.post("/v1/completions", json=body, headers=headers)
    message = response.json().get("error", {}).get("message", "")
    return "400" if response.status_code == 400 and "sent 2 times" in message else str(response.status_code)


async def _ids_empty(http: httpx.AsyncClient, _: Any, doors: Doors, rng: random.Random) -> str:
    body = {"model": doors.model, "prompt": "Hello", "max_tokens": 2}
    response = await http.post("/v1/completions", json=body, headers={"X-Request-Id": ""})
    random_id = response.headers.get("x-request-id", "")
    is_random = re.fullmatch(r"[0-9a-f]{32}", random_id) is not None
    return str(response.status_code) if is_random else f"{response.status_code}: id {random_id!r}"


NUM_IDLE_METRICS_SOCKETS = 40


async def _metrics_scrape_idle(http: httpx.AsyncClient, _: Any, doors: Doors, rng: random.Random) -> str:
    """Three scrapes while 40 sockets sit idle on the metrics port."""
    idle = [await asyncio.open_connection(doors.host, doors.metrics_port) for _ in range(NUM_IDLE_METRICS_SOCKETS)]
    try:
        url = f"http://{doors.host}:{doors.metrics_port}/metrics"
        statuses = []
        for _ in range(3):
            try:
                statuses.append((await http.get(url, timeout=10)).status_code)
            except httpx.HTTPError:
                statuses.append(0)
    finally:
        for _, writer in idle:
            writer.close()
    return "scraped" if statuses == [200, 200, 200] else f"blind: {statuses}"


ISSUE_27 = {"grammar_slow": _grammar_slow, "grpc_grammar_slow": _grpc_grammar_slow, "json_strings": _json_strings,
            "grpc_json_strings": _grpc_json_strings, "schema_refused": _schema_refused, "tool_invalid": _tool_invalid,
            "ids_n": _ids_n, "ids_twice": _ids_twice, "ids_empty": _ids_empty,
            "metrics_scrape_idle": _metrics_scrape_idle}  # fmt: skip
