"""Structured output and tools with the official `openai` client, through the gateway, on the default model:
`.parse()` with a pydantic model, sampled outputs that validate, a tool round trip, errors naming the field."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.helpers.bench_data import structured_schemas
from tests.unit.server.gateway.gateway_helpers import RunningGateway


def _object(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


SHORT = {"type": "string", "maxLength": 16}
SCHEMAS = structured_schemas()  # benchmarks/structured.py's
WEATHER: Any = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": _object({"city": SHORT}, ["city"])}}  # fmt: skip


class Person(BaseModel):
    name: str = Field(max_length=20)
    age: int = Field(ge=0, le=120)


def ask(text: str) -> Any:
    return [{"role": "user", "content": text}]


def test_parse_returns_the_pydantic_object(client: openai.OpenAI, model: str) -> None:
    out = client.chat.completions.parse(model=model, messages=ask("Describe a person."), response_format=Person,
                                        temperature=0, max_completion_tokens=48)  # fmt: skip
    person = out.choices[0].message.parsed
    assert isinstance(person, Person) and 0 <= person.age <= 120
    assert out.choices[0].finish_reason == "stop"


def _samples(gateway: RunningGateway, model: str, per_schema: int) -> list[tuple[str, str, str | None]]:
    """(schema name, content, finish reason) of `per_schema` samples at temperature 1 per schema, all at once."""

    async def one(client: openai.AsyncOpenAI, name: str, seed: int) -> tuple[str, str, str | None]:
        response_format: Any = {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name],
                                                                       "strict": True}}  # fmt: skip
        out = await client.chat.completions.create(
            model=model, messages=ask(f"A JSON object: {name}."), response_format=response_format,
            temperature=1.0, seed=seed, max_completion_tokens=96)  # fmt: skip
        return name, out.choices[0].message.content or "", out.choices[0].finish_reason

    async def main() -> list[tuple[str, str, str | None]]:
        async with openai.AsyncOpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0) as client:
            jobs = [one(client, name, seed) for name in SCHEMAS for seed in range(per_schema)]
            return list(await asyncio.gather(*jobs))

    return asyncio.run(main())


def test_twenty_sampled_outputs_over_five_schemas_all_validate(gateway: RunningGateway, model: str) -> None:
    # NOTE: all 20 at once, batched; tests/fuzz/test_schemas.py drives many more schemas with adversarial tokens
    samples = _samples(gateway, model, per_schema=4)
    assert len(samples) == 20
    for name, content, reason in samples:
        assert reason == "stop", (name, content)
        jsonschema.validate(json.loads(content), SCHEMAS[name])


def test_vllm_choice_and_an_invalid_schema(client: openai.OpenAI, model: str) -> None:
    choices = ["positive", "negative"]
    out = client.chat.completions.create(model=model, messages=ask("vLLM is wonderful! Sentiment?"),
                                         extra_body={"guided_choice": choices}, temperature=0)  # fmt: skip
    assert out.choices[0].message.content in choices
    bad: Any = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=model, messages=ask("Hi"), response_format=bad)
    assert info.value.status_code == 400
    error = info.value.body
    assert isinstance(error, dict) and error["param"] == "response_format"
    assert error["message"].startswith("response_format: does not compile: ")


def _call(client: openai.OpenAI, model: str, messages: Any, stream: bool, **kw: Any) -> tuple[str, list[Any], str]:
    """(content, tool calls as {"id", "name", "arguments"}, finish reason), whole or merged from the stream."""
    if not stream:
        out = client.chat.completions.create(model=model, messages=messages, tools=[WEATHER], temperature=0,
                                             max_completion_tokens=48, **kw)  # fmt: skip
        choice = out.choices[0]
        calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}  # type: ignore[union-attr]
                 for c in choice.message.tool_calls or []]  # fmt: skip
        return choice.message.content or "", calls, str(choice.finish_reason)
    content, merged, reason = "", {}, ""
    for chunk in client.chat.completions.create(model=model, messages=messages, tools=[WEATHER], temperature=0,
                                                max_completion_tokens=48, stream=True, **kw):  # fmt: skip
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for call in delta.tool_calls or []:
            entry = merged.setdefault(call.index, {"id": call.id, "name": "", "arguments": ""})
            entry["name"] += (call.function and call.function.name) or ""
            entry["arguments"] += (call.function and call.function.arguments) or ""
        reason = chunk.choices[0].finish_reason or reason
    return content, [merged[i] for i in sorted(merged)], reason


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_tool_round_trip(client: openai.OpenAI, model: str, stream: bool) -> None:
    """A call, its result back in the history, then an answer."""
    history = ask("What is the weather in Paris?")
    content, calls, reason = _call(client, model, history, stream, tool_choice="required")
    assert reason == "tool_calls" and content == "" and len(calls) >= 1
    call = calls[0]
    assert call["name"] == "get_weather" and call["id"].startswith("call_")
    jsonschema.validate(json.loads(call["arguments"]), WEATHER["function"]["parameters"])
    function = {"name": call["name"], "arguments": call["arguments"]}
    made = {"id": call["id"], "type": "function", "function": function}
    history += [
        {"role": "assistant", "content": None, "tool_calls": [made]},
        {"role": "tool", "tool_call_id": call["id"], "content": "18 C and sunny"},
    ]  # fmt: skip
    content, calls, reason = _call(client, model, history, stream, tool_choice="none")
    assert content and calls == [] and reason in ("stop", "length")
