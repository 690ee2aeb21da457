"""Structured output and tools in OpenAI bodies: `response_format`, vLLM's `guided_*` and `structured_outputs`,
`tools` / `tool_choice`, and tool calls and results in the history; and their infer.v1 form.

The model server compiles the constraints and names what does not compile; here: shapes, and that one
request asks for one constraint at most.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from infer.api import pb
from infer.server.gateway.errors import unsupported
from infer.server.gateway.strict import Strict

JsonSchema = dict[str, Any]


class JsonSchemaFormat(Strict):
    name: str = "response"
    description: str | None = None
    schema_: Annotated[JsonSchema | None, Field(alias="schema")] = None
    strict: bool | None = None  # accepted: the output always follows the schema


class ResponseFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _check(self) -> ResponseFormat:
        if self.type == "json_schema" and (self.json_schema is None or self.json_schema.schema_ is None):
            raise unsupported("response_format", "json_schema needs json_schema.schema")
        return self


class StructuredOutputsField(Strict):
    """The body field `structured_outputs`: vLLM's newer form of the guided_* fields; one of these at most."""

    json_: Annotated[JsonSchema | str | None, Field(alias="json")] = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None


class Guided(Strict):
    """The constraint fields both endpoints take."""

    response_format: ResponseFormat | None = None
    guided_json: JsonSchema | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    structured_outputs: StructuredOutputsField | None = None

    def constraints(self) -> dict[str, tuple[str, Any]]:
        """{body field: (proto field, value)} of every constraint the body sets."""
        found: dict[str, tuple[str, Any]] = {}
        rf = self.response_format
        if rf is not None and rf.type == "json_object":
            found["response_format"] = ("json_object", True)
        elif rf is not None and rf.type == "json_schema" and rf.json_schema is not None:
            found["response_format"] = ("json_schema", rf.json_schema.schema_)
        guided = {
            "guided_json": ("json_schema", self.guided_json),
            "guided_regex": ("regex", self.guided_regex),
            "guided_choice": ("choice", self.guided_choice),
            "guided_grammar": ("grammar", self.guided_grammar),
        }
        found |= {name: value for name, value in guided.items() if value[1] is not None}
        so = self.structured_outputs
        if so is not None:
            fields = {
                "json": ("json_schema", so.json_),
                "regex": ("regex", so.regex),
                "choice": ("choice", so.choice),
                "grammar": ("grammar", so.grammar),
                "json_object": ("json_object", so.json_object or None),
            }
            found |= {f"structured_outputs.{k}": v for k, v in fields.items() if v[1] is not None}
        return found

    @model_validator(mode="after")
    def _one_constraint(self) -> Guided:
        names = list(self.constraints())
        if len(names) > 1:
            raise unsupported(names[1], f"one constraint at most: {' and '.join(names[:2])} are both set")
        return self

    @property
    def constraint_param(self) -> str | None:
        """The body field that carries the constraint: where its errors point."""
        return next(iter(self.constraints()), None)


def set_constraint(params: pb.SamplingParams, body: Guided) -> None:
    for proto_field, value in body.constraints().values():
        if proto_field == "json_object":
            params.json_object.SetInParent()
        elif proto_field == "choice":
            params.choice.choices.extend(value)
        elif proto_field == "json_schema":
            params.json_schema = value if isinstance(value, str) else json.dumps(value)
        else:
            setattr(params, proto_field, value)


# --- tools


class Function(Strict):
    name: str
    description: str | None = None
    parameters: JsonSchema | None = None
    strict: bool | None = None  # accepted: calls that tool_choice forces always follow the schema


class ToolDef(Strict):
    type: Literal["function"]
    function: Function


class FunctionName(Strict):
    name: str


class NamedToolChoice(Strict):
    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice

_MODES = {"none": pb.TOOL_CHOICE_MODE_NONE, "auto": pb.TOOL_CHOICE_MODE_AUTO, "required": pb.TOOL_CHOICE_MODE_REQUIRED}


class CalledFunction(Strict):
    name: str
    arguments: str = "{}"  # JSON text


class ToolCall(Strict):
    id: str = ""
    type: Literal["function"] = "function"
    function: CalledFunction


def tools_proto(tools: list[ToolDef]) -> list[pb.Tool]:
    return [pb.Tool(name=t.function.name, description=t.function.description or "",
                    parameters=json.dumps(t.function.parameters) if t.function.parameters is not None else "")
            for t in tools]  # fmt: skip


def tool_choice_proto(choice: ToolChoice) -> pb.ToolChoice:
    if isinstance(choice, NamedToolChoice):
        return pb.ToolChoice(function=choice.function.name)
    return pb.ToolChoice(mode=_MODES[choice])


def calls_proto(calls: list[ToolCall]) -> list[pb.ToolCall]:
    return [pb.ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments) for c in calls]
