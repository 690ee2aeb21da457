"""The gateway's structured output and tools: what reaches the model server, what comes back, and errors that
point at the body's own fields. The model server here is a fake (gateway_helpers.FakeInference)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from infer.api import pb
from tests.unit.server.gateway.gateway_helpers import (
    CHAT,
    COMPLETIONS,
    FakeInference,
    RunningGateway,
    chat_body,
    completion_body,
    error_of,
    sse_data,
)

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
CITY = {"type": "object", "properties": {"city": {"type": "string"}}}
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Weather in a city", "parameters": CITY},
}


@pytest.mark.parametrize(
    ("fields", "field", "value"),
    [
        ({"response_format": {"type": "json_object"}}, "json_object", pb.JsonObject()),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "n", "schema": SCHEMA, "strict": True},
                }
            },
            "json_schema",
            json.dumps(SCHEMA),
        ),
        ({"response_format": {"type": "text"}}, None, None),
        ({"guided_json": SCHEMA}, "json_schema", json.dumps(SCHEMA)),
        ({"guided_json": '{"type": "object"}'}, "json_schema", '{"type": "object"}'),
        ({"guided_regex": "[0-9]+"}, "regex", "[0-9]+"),
        ({"guided_choice": ["yes", "no"]}, "choice", pb.Choices(choices=["yes", "no"])),
        ({"guided_grammar": 'root ::= "a"'}, "grammar", 'root ::= "a"'),
        ({"structured_outputs": {"json": SCHEMA}}, "json_schema", json.dumps(SCHEMA)),
        ({"structured_outputs": {"regex": "x+"}}, "regex", "x+"),
        ({"structured_outputs": {"choice": ["a"]}}, "choice", pb.Choices(choices=["a"])),
        ({"structured_outputs": {"json_object": True}}, "json_object", pb.JsonObject()),
    ],
)
@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_each_constraint_field_reaches_the_model_server(
    http: httpx.Client, fake: FakeInference, path: str, fields: dict[str, Any], field: str | None, value: Any
) -> None:
    body = chat_body(**fields) if path == CHAT else completion_body(**fields)
    assert http.post(path, json=body).status_code == 200
    sampling = fake.requests[-1].sampling
    assert sampling.WhichOneof("constraint") == field
    if field is not None:
        assert getattr(sampling, field) == value


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex"),
        ({"guided_json": SCHEMA, "structured_outputs": {"regex": "a"}}, "structured_outputs.regex"),
        ({"tools": [WEATHER], "tool_choice": "required", "guided_regex": "a"}, "guided_regex"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"functions": [{"name": "f"}]}, "functions"),
    ],
)
def test_conflicting_or_incomplete_fields_are_422(
    http: httpx.Client, fake: FakeInference, fields: dict[str, Any], param: str
) -> None:
    error = error_of(http.post(CHAT, json=chat_body(**fields)), 422)
    assert error["param"] == param and error["code"] == "unsupported_value"
    assert fake.requests == []


@pytest.mark.parametrize(
    ("fields", "refusal", "status", "param", "message"),
    [
        ({"guided_regex": "(("}, "/DOES_NOT_COMPILE:sampling.regex: does not compile: bad regex", 400, "guided_regex",
         "guided_regex: does not compile: bad regex"),
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "objekt"}}}},
         "/DOES_NOT_COMPILE:sampling.json_schema: does not compile: Unsupported type", 400, "response_format",
         "response_format: does not compile: Unsupported type"),
        ({"tools": [WEATHER]}, "/DOES_NOT_COMPILE:tools[0].parameters: does not compile: nope", 400,
         "tools[0].function.parameters", "tools[0].function.parameters: does not compile: nope"),
        ({"tools": [WEATHER]}, "tools[0].name: must be 1 to 64 characters", 422, "tools[0].function.name",
         "tools[0].function.name: must be 1 to 64 characters"),
        ({}, "sampling.top_p: must be in (0, 1]", 422, "top_p", "sampling.top_p: must be in (0, 1]"),
    ],
)  # fmt: skip
def test_the_model_servers_refusals_point_at_the_body_field(
    http: httpx.Client, fake: FakeInference, fields: dict[str, Any], refusal: str, status: int, param: str,
    message: str,
) -> None:  # fmt: skip
    """`/REASON:`: the reason the model server sends beside the refusal (INVALID_VALUE unless given)."""
    prompt = f"status:INVALID_ARGUMENT{refusal}" if refusal.startswith("/") else f"status:INVALID_ARGUMENT:{refusal}"
    body = chat_body(messages=[{"role": "user", "content": prompt}], **fields)
    error = error_of(http.post(CHAT, json=body), status)
    assert (error["param"], error["message"]) == (param, message)


ARGS = '{"city": "Paris"}'
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ARGS}}


def test_tools_and_the_history_reach_the_model_server(http: httpx.Client, fake: FakeInference) -> None:
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "content": "18 C", "tool_call_id": "call_1"},
    ]  # fmt: skip
    body = chat_body(messages=messages, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False)
    assert http.post(CHAT, json=body).status_code == 200
    request = fake.requests[-1]
    assert [(t.name, t.description, json.loads(t.parameters)) for t in request.tools] == [
        ("get_weather", "Weather in a city", WEATHER["function"]["parameters"])
    ]
    assert request.tool_choice.mode == pb.TOOL_CHOICE_MODE_REQUIRED and request.parallel_tool_calls is False
    sent = request.messages.messages
    assert [(c.id, c.name, c.arguments) for c in sent[1].tool_calls] == [("call_1", "get_weather", '{"city": "Paris"}')]
    assert (sent[2].role, sent[2].content, sent[2].tool_call_id) == ("tool", "18 C", "call_1")
    named = chat_body(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert http.post(CHAT, json=named).status_code == 200
    assert fake.requests[-1].tool_choice.function == "get_weather"
    assert not fake.requests[-1].HasField("parallel_tool_calls")


TOOL_CALLS = [("call_a", "get_weather", {"city": "Paris"}), ("call_b", "get_time", {})]


def test_tool_calls_come_back_as_openai_tool_calls(gateway: RunningGateway, fake: FakeInference) -> None:
    client = openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)
    messages: Any = [{"role": "user", "content": "tool-calls"}]
    out = client.chat.completions.create(model="fake-model", messages=messages, tools=[WEATHER])  # type: ignore[list-item]
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Sure."
    calls = choice.message.tool_calls or []
    assert [(c.id, c.function.name, json.loads(c.function.arguments)) for c in calls] == TOOL_CALLS  # type: ignore[union-attr]


def test_streamed_tool_calls_are_deltas_clients_can_merge(gateway: RunningGateway, fake: FakeInference) -> None:
    client = openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)
    messages: Any = [{"role": "user", "content": "tool-calls"}]
    stream = client.chat.completions.create(model="fake-model", messages=messages, tools=[WEATHER], stream=True)  # type: ignore[list-item]
    merged: dict[int, list[str]] = {}
    reasons = []
    for chunk in stream:
        delta = chunk.choices[0].delta
        for call in delta.tool_calls or []:
            assert call.function is not None
            if call.id is not None:
                assert call.index not in merged and call.type == "function"
                merged[call.index] = [call.id, call.function.name or "", ""]
            merged[call.index][2] += call.function.arguments or ""
        reasons.append(chunk.choices[0].finish_reason)
    assert [(i, n, json.loads(a)) for i, n, a in (merged[k] for k in sorted(merged))] == TOOL_CALLS
    assert reasons[-1] == "tool_calls"


def test_the_raw_stream_has_openais_tool_call_shape(http: httpx.Client, fake: FakeInference) -> None:
    body = chat_body(messages=[{"role": "user", "content": "tool-calls"}], tools=[WEATHER], stream=True)
    chunks = [json.loads(d) for d in sse_data(http.post(CHAT, json=body))[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks if "tool_calls" in c["choices"][0]["delta"]]
    assert deltas[0]["tool_calls"] == [{"index": 0, "id": "call_a", "type": "function",
                                        "function": {"name": "get_weather", "arguments": '{"city": '}}]  # fmt: skip
    assert deltas[1]["tool_calls"][0] == {"index": 0, "function": {"arguments": '"Paris"}'}}
