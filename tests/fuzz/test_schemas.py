"""Structured output at both front doors (issue 27, findings 2-4), on the fake engine, whose model here favours
control characters, quotes and backslashes (schemas.HOSTILE_TEXT) and samples at up to temperature 1.5:

- every output under a JSON schema (strings with maxLength, pattern, enum, format), json_object or a required
  tool call holds no raw control character, and every finished one `json.loads` and validates with jsonschema;
- a schema with a keyword or `$ref` that would not be enforced is refused (gRPC INVALID_ARGUMENT, HTTP 400)
  naming the field, the place and the keyword; a remote `$ref` is never fetched;
- a tool with invalid parameters is refused under every tool_choice, naming tools[i].function.parameters.

After each example the engine holds no request and no KV block. `make test` runs a short pass, `make fuzz` a long one.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import jsonschema
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from infer.api import pb, pb_grpc
from tests.fuzz.schemas import (
    HOSTILE_TEXT,
    INVITING,
    BadTools,
    RefusedSchema,
    bad_tools,
    object_schemas,
    refused_schemas,
)
from tests.fuzz.strategies import examples
from tests.helpers.fake_engine import FakeRunner
from tests.integration.grpc_helpers import ServerThread, running_fake_server

pytestmark = pytest.mark.fuzz
MODEL = "fake"
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
MAX_TOKENS = 160
PROMPTS = st.one_of(st.sampled_from(INVITING), st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]),
                                                       min_size=1, max_size=40))  # fmt: skip
TEMPERATURES = st.one_of(st.just(1.5), st.floats(0.0, 1.5))
# NOTE: the draft's own checker: FormatChecker() holds every draft's, and its "time" is draft 3's (no time zone)
FORMATS_2020_12 = jsonschema.Draft202012Validator.FORMAT_CHECKER


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    with running_fake_server(max_model_len=4096, num_blocks=512, max_num_seqs=8) as s:
        runner = s.engine.core.runner
        assert isinstance(runner, FakeRunner)
        runner.text_ids = s.engine.core.tokenizer.encode(HOSTILE_TEXT * 300)
        yield s


@pytest.fixture(scope="module")
def listener() -> Iterator[socket.socket]:
    """Where the remote `$ref`s of the refused schemas point: no connection may ever arrive."""
    with socket.create_server(("127.0.0.1", 0)) as sock:
        sock.setblocking(False)
        yield sock
        _assert_never_fetched(sock)


def _assert_never_fetched(listener: socket.socket) -> None:
    try:
        conn, _ = listener.accept()
    except BlockingIOError:
        return
    conn.close()
    raise AssertionError("a remote $ref was fetched")


# --- every output parses and validates


def _check_output(text: str, finished: bool, schema: dict[str, Any] | None) -> None:
    """No raw control character even in an unfinished output (no free whitespace: none is ever valid); a
    finished one parses and validates."""
    assert not any(ord(c) < 0x20 for c in text), repr(text)
    event("finished" if finished else "max_tokens")
    if not finished:
        return
    value = json.loads(text)
    if schema is None:  # json_object
        assert isinstance(value, dict), text
        return
    errors = list(jsonschema.Draft202012Validator(schema, format_checker=FORMATS_2020_12).iter_errors(value))
    upstream = [e for e in errors if e.validator == "pattern" and "\ufffd" in str(e.instance)]
    if upstream:
        # NOTE: xgrammar 0.2.8 lets bytes that are no UTF-8 through a pattern's `.`, `[^...]` and `\S` (they decode
        # to U+FFFD): counted, not failed (tests/unit/engine/test_structured_schema.py keeps it as an xfail)
        event("xgrammar: a pattern took bytes that are no UTF-8")
    assert [e for e in errors if e not in upstream] == [], errors


def _grpc_output(
    stub: pb_grpc.InferenceServiceStub, schema: dict[str, Any], prompt: str, temperature: float, seed: int
) -> None:
    sampling = pb.SamplingParams(max_tokens=MAX_TOKENS, temperature=temperature, seed=seed,
                                 json_schema=json.dumps(schema))  # fmt: skip
    messages = pb.ChatMessages(messages=[pb.ChatMessage(role="user", content=prompt)])
    responses = list(stub.Generate(pb.GenerateRequest(messages=messages, sampling=sampling), timeout=60))
    finished = responses[-1].finish_reason == pb.FINISH_REASON_STOP
    _check_output("".join(r.text for r in responses), finished, schema)


def _http_output(
    http: httpx.Client, door: str, schema: dict[str, Any], prompt: str, temperature: float, seed: int
) -> None:
    body: dict[str, Any] = {"model": MODEL, "max_tokens": MAX_TOKENS, "temperature": temperature, "seed": seed}
    messages = [{"role": "user", "content": prompt}]
    if door == "guided_json":
        response = http.post(COMPLETIONS, json=body | {"prompt": prompt, "guided_json": schema})
    elif door == "json_object":
        response = http.post(CHAT, json=body | {"messages": messages, "response_format": {"type": "json_object"}})
    elif door == "tool":
        tool = {"type": "function", "function": {"name": "fill", "parameters": schema}}
        choice = "required" if "required" in prompt else {"type": "function", "function": {"name": "fill"}}
        body |= {"messages": messages, "tools": [tool], "tool_choice": choice, "parallel_tool_calls": False}
        response = http.post(CHAT, json=body)
    else:
        response_format = {"type": "json_schema", "json_schema": {"name": "out", "schema": schema}}
        response = http.post(CHAT, json=body | {"messages": messages, "response_format": response_format})
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    if door == "tool":
        calls = choice["message"].get("tool_calls") or []
        assert choice["finish_reason"] in ("tool_calls", "length"), choice
        for call in calls:
            assert call["function"]["name"] == "fill"
            _check_output(call["function"]["arguments"], choice["finish_reason"] == "tool_calls", schema)
        return
    text = choice["text"] if door == "guided_json" else choice["message"]["content"]
    _check_output(text, choice["finish_reason"] == "stop", None if door == "json_object" else schema)


DOORS = ["grpc", "response_format", "guided_json", "json_object", "tool"]


@examples(ci=10, fuzz=600)
@given(schema=object_schemas(), door=st.sampled_from(DOORS), prompt=PROMPTS, temperature=TEMPERATURES,
       required=st.booleans(), seed=st.integers(0, 2**31))  # fmt: skip
def test_every_output_under_a_schema_parses_and_validates(
    server: ServerThread, stub: pb_grpc.InferenceServiceStub, http: httpx.Client, schema: dict[str, Any], door: str,
    prompt: str, temperature: float, required: bool, seed: int,
) -> None:  # fmt: skip
    event(door)
    if door == "grpc":
        _grpc_output(stub, schema, prompt, temperature, seed)
    else:
        _http_output(http, door, schema, prompt + (" (required)" if required else ""), temperature, seed)
    server.wait_idle()


# --- what would not be enforced is refused, by name


@examples(ci=15, fuzz=1500)
@given(refused=refused_schemas(), door=st.sampled_from(["grpc", "response_format", "guided_json"]))
def test_a_schema_that_would_not_be_enforced_is_refused_naming_it(
    server: ServerThread, stub: pb_grpc.InferenceServiceStub, http: httpx.Client, listener: socket.socket,
    refused: RefusedSchema, door: str,
) -> None:  # fmt: skip
    refused = refused.bound(listener.getsockname()[1])
    event(refused.says.split(" is ")[0][:30])
    if door == "grpc":
        sampling = pb.SamplingParams(max_tokens=4, json_schema=json.dumps(refused.schema))
        with pytest.raises(grpc.RpcError) as error:
            list(stub.Generate(pb.GenerateRequest(prompt="Hi", sampling=sampling), timeout=60))
        assert error.value.code() is grpc.StatusCode.INVALID_ARGUMENT, error.value
        message = str(error.value.details())
        field = "sampling.json_schema"
    else:
        body: dict[str, Any] = {"model": MODEL, "max_tokens": 4}
        if door == "guided_json":
            response = http.post(COMPLETIONS, json=body | {"prompt": "Hi", "guided_json": refused.schema})
        else:
            response_format = {"type": "json_schema", "json_schema": {"name": "out", "schema": refused.schema}}
            response = http.post(CHAT, json=body | {"messages": [{"role": "user", "content": "Hi"}],
                                                    "response_format": response_format})  # fmt: skip
        assert response.status_code == 400, response.text
        error_body = response.json()["error"]
        assert error_body["param"] == door, error_body
        message, field = error_body["message"], door
    assert message.startswith(f"{field}: does not compile: {refused.path}: "), (message, refused.path)
    assert refused.says in message, (message, refused.says)
    _assert_never_fetched(listener)
    server.wait_idle()


@examples(ci=15, fuzz=1500)
@given(tools=bad_tools(), door=st.sampled_from(["grpc", "http"]))
def test_invalid_tool_parameters_are_refused_under_every_tool_choice(
    server: ServerThread, stub: pb_grpc.InferenceServiceStub, http: httpx.Client, listener: socket.socket,
    tools: BadTools, door: str,
) -> None:  # fmt: skip
    port = listener.getsockname()[1]
    tools = BadTools([json.loads(json.dumps(p).replace("LISTENER_PORT", str(port))) for p in tools.parameters],
                     {i: r.bound(port) for i, r in tools.bad.items()}, tools.choice)  # fmt: skip
    index = tools.first_refused()
    says = tools.bad[index].says
    event(f"tool_choice {tools.choice if not tools.choice.startswith('tool_') else 'named'}")
    if door == "grpc":
        request = _grpc_tools_request(tools)
        with pytest.raises(grpc.RpcError) as error:
            list(stub.Generate(request, timeout=60))
        assert error.value.code() is grpc.StatusCode.INVALID_ARGUMENT, error.value
        message, field = str(error.value.details()), f"tools[{index}].parameters"
    else:
        body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}], **tools.openai()}
        response = http.post(CHAT, json=body)
        assert response.status_code == 400, response.text
        error_body = response.json()["error"]
        field = f"tools[{index}].function.parameters"
        assert error_body["param"] == field, error_body
        message = error_body["message"]
    assert message.startswith(f"{field}: does not compile: "), (message, field)
    assert says in message, (message, says)
    _assert_never_fetched(listener)
    server.wait_idle()


def _grpc_tools_request(tools: BadTools) -> pb.GenerateRequest:
    request = pb.GenerateRequest(messages=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="Hi")]),
                                 sampling=pb.SamplingParams(max_tokens=4))  # fmt: skip
    for name, params in zip(tools.names(), tools.parameters, strict=True):
        request.tools.append(pb.Tool(name=name, parameters=json.dumps(params)))
    modes = {"auto": pb.TOOL_CHOICE_MODE_AUTO, "none": pb.TOOL_CHOICE_MODE_NONE,
             "required": pb.TOOL_CHOICE_MODE_REQUIRED}  # fmt: skip
    if tools.choice in modes:
        request.tool_choice.mode = modes[tools.choice]
    elif tools.choice != "absent":
        request.tool_choice.function = tools.choice
    return request
