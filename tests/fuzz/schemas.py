"""JSON schemas and tools as issue 27 found them: schemas whose strings take maxLength, pattern, enum and format
(every output must parse and validate), schemas with a keyword or `$ref` the grammar would not enforce (refused
by name and place, nothing fetched), and tools whose parameters are invalid (refused under every tool_choice).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

# characters a JSON string must escape, and a few that it need not
ESCAPY = ["a\tb", 'say "hi"', "back\\slash", "\x01", "\x00", "\x1f", "é", "line\nbreak", "\\u0009", "🙂", "/"]
PATTERNS = ["^[a-z]{1,5}$", "^[^a]{0,6}$", "^.{0,8}$", "^\\S{1,6}$", "^[\\s\\S]{2}$", "^[0-9]{3}-[0-9]{4}$"]
FORMATS = ["date", "email", "uuid", "ipv4", "date-time", "time"]
# property names that must be escaped in the output, and one that must be escaped in a JSON pointer
NAMES = ["p", "q", "a b", 'say "x"', "tab\there", "back\\", "é", "a/b", "\x01"]
# text that invites the output to copy control characters and escapes
INVITING = [
    "Copy this tab-separated line exactly, as JSON: name\tage\tcity\x01\x02",
    'Return {"s": "<the line>"} for the line: a\tb\\c"d\x00e',
    "Write the escapes \\t \\n \\u0009 \\x41 and a raw tab:\t.",
    "Echo these bytes: \x00\x01\x1b[31mred\x1b[0m\r\n",
]
# the fake model continues this (tests/helpers/fake_engine.py): the tokens it favours are control characters,
# quotes and backslashes, which a JSON string must escape
HOSTILE_TEXT = 'a\tb\x00"\\\n\x01c\r\x1f\\u00"' + "\t\t\x02\\x41\\"


def _string(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(["plain", "max", "min_max", "min", "pattern", "format", "enum"]))
    if kind == "max":
        return {"type": "string", "maxLength": draw(st.integers(0, 12))}
    if kind == "min_max":
        low = draw(st.integers(0, 4))
        return {"type": "string", "minLength": low, "maxLength": low + draw(st.integers(0, 8))}
    if kind == "min":
        return {"type": "string", "minLength": draw(st.integers(1, 4))}
    if kind == "pattern":
        return {"type": "string", "pattern": draw(st.sampled_from(PATTERNS))}
    if kind == "format":
        return {"type": "string", "format": draw(st.sampled_from(FORMATS))}
    if kind == "enum":
        return {"type": "string", "enum": draw(st.lists(st.sampled_from(ESCAPY), min_size=1, max_size=4, unique=True))}
    return {"type": "string"}


@st.composite
def _value(draw: st.DrawFn, depth: int) -> dict[str, Any]:
    kinds = ["string", "string", "string", "integer", "number", "boolean", "null", "enum"]
    kind = draw(st.sampled_from(kinds + ["array", "object"] * (depth < 2)))
    if kind == "string":
        return _string(draw)
    if kind == "integer":
        low = draw(st.integers(-50, 50))
        return {"type": "integer", "minimum": low, "maximum": low + draw(st.integers(0, 100))}
    if kind == "enum":
        return {"enum": [*draw(st.lists(st.sampled_from(ESCAPY), min_size=1, max_size=3, unique=True)), 1, None]}
    if kind == "array":
        return {"type": "array", "items": draw(_value(depth + 1)), "maxItems": draw(st.integers(0, 3))}
    if kind == "object":
        return draw(object_schemas(depth + 1))
    return {"type": kind}


@st.composite
def object_schemas(draw: st.DrawFn, depth: int = 0) -> dict[str, Any]:
    """An object of 1 to 4 properties (names that need escaping among them), no others allowed."""
    names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=4, unique=True))
    properties = {name: draw(_value(depth)) for name in names}
    required = [name for name in names if draw(st.booleans())]
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


# --- what is refused: a keyword beside a schema's own, or a schema in place of one

ADDED: list[tuple[dict[str, Any], str]] = [
    ({"not": {"type": "integer"}}, "not is not enforced"),
    ({"if": {"type": "string"}, "then": {"type": "string", "maxLength": 3}}, "if/then/else is not enforced"),
    ({"contains": {"const": 1}}, "contains (and minContains/maxContains) is not enforced"),
    ({"dependentRequired": {"a": ["b"]}}, "dependentRequired is not enforced"),
    ({"dependentSchemas": {"a": {"type": "object"}}}, "dependentSchemas is not enforced"),
    ({"dependencies": {"a": ["b"]}}, "dependencies is not enforced"),
    ({"additionalItems": False}, "additionalItems (use prefixItems and items) is not enforced"),
    ({"$dynamicRef": "#x"}, "$dynamicRef is not enforced"),
    ({"$recursiveRef": "#"}, "$recursiveRef is not enforced"),
    ({"uniqueItems": True}, "uniqueItems is not enforced"),
]
LISTENER = "127.0.0.1:LISTENER_PORT"  # the test's own listener: a fetch would reach it
REMOTE_REFS = [f"http://{LISTENER}/schema.json", f"https://{LISTENER}/s.json#/a", f"//{LISTENER}/x",
               "http://169.254.169.254/latest/meta-data", "other.json#/x", "file:///etc/passwd"]  # fmt: skip
REPLACED: list[tuple[dict[str, Any], str]] = [
    *(({"$ref": ref}, f"$ref {ref!r} is a remote reference") for ref in REMOTE_REFS),
    ({"$ref": "#frag"}, "$ref '#frag' is an anchor reference"),
    ({"type": "string", "pattern": '^a"b$'}, "a literal '\"', '\\\\' or control character is not supported"),
    ({"type": "string", "pattern": "^a\\tb$"}, "a literal '\"', '\\\\' or control character is not supported"),
    ({"type": "string", "format": "regex"}, "format 'regex' is not enforced"),
    ({"type": "string", "pattern": "^a+$", "maxLength": 3}, "pattern together with maxLength is not enforced"),
    ({"type": "integer", "anyOf": [{"minimum": 3}]}, "type beside anyOf is not enforced"),
    ({"type": "number", "multipleOf": 0.5}, 'multipleOf is enforced only for "type": "integer"'),
    ({"minimum": 3}, "minimum needs a type"),
]


@dataclass(frozen=True)
class RefusedSchema:
    """A schema that must be refused, the place its refusal names (a JSON pointer) and what it says there."""

    schema: dict[str, Any]
    path: str
    says: str

    def bound(self, port: int) -> RefusedSchema:
        """With the listener's port in place of LISTENER_PORT."""
        text = json.dumps(self.schema).replace("LISTENER_PORT", str(port))
        return RefusedSchema(json.loads(text), self.path, self.says.replace("LISTENER_PORT", str(port)))


def _nodes(schema: dict[str, Any], path: str = "#") -> Iterator[tuple[str, dict[str, Any]]]:
    """(JSON pointer, subschema) of the schema and of its properties' and items' schemas."""
    yield path, schema
    for name, child in schema.get("properties", {}).items():
        yield from _nodes(child, f"{path}/properties/{name.replace('~', '~0').replace('/', '~1')}")
    if isinstance(schema.get("items"), dict):
        yield from _nodes(schema["items"], f"{path}/items")


@st.composite
def refused_schemas(draw: st.DrawFn) -> RefusedSchema:
    """A valid object schema with one of its subschemas (the root included) spoiled."""
    schema = draw(object_schemas())
    path, node = draw(st.sampled_from(list(_nodes(schema))))
    how = draw(st.sampled_from(["added", "replaced", "all_of"]))
    if how == "added":
        extra, says = draw(st.sampled_from(ADDED))
        node.update(json.loads(json.dumps(extra)))
    elif how == "replaced":
        spoiled, says = draw(st.sampled_from(REPLACED))
        node.clear()
        node.update(json.loads(json.dumps(spoiled)))
    else:
        own = dict(node)
        node.clear()
        node["allOf"] = [own, {"type": "object"}]
        says = "allOf of more than one schema is not enforced"
    return RefusedSchema(schema, path, says)


# --- tools whose parameters are refused

UNSUPPORTED_TYPE = RefusedSchema({"type": "objekt"}, "", "Unsupported type")  # refused by xgrammar, when compiled


@dataclass(frozen=True)
class BadTools:
    """Tools of which some have invalid parameters, and the tool_choice they are sent with."""

    parameters: list[dict[str, Any]]
    bad: dict[int, RefusedSchema]  # by tool index
    choice: str  # absent, auto, none, required, or the name of a tool

    def names(self) -> list[str]:
        return [f"tool_{i}" for i in range(len(self.parameters))]

    def first_refused(self) -> int:
        """The tool the refusal names: each tool's schema is checked as the tools are read, in order, before any
        compiles; then each compiles in order (UNSUPPORTED_TYPE only fails there)."""
        checked = [i for i, refused in self.bad.items() if refused != UNSUPPORTED_TYPE]
        return min(checked) if checked else min(self.bad)

    def openai(self) -> dict[str, Any]:
        """The tools and tool_choice fields of a chat body."""
        tools = [{"type": "function", "function": {"name": name, "description": "a tool", "parameters": params}}
                 for name, params in zip(self.names(), self.parameters, strict=True)]  # fmt: skip
        body: dict[str, Any] = {"tools": tools}
        if self.choice in ("auto", "none", "required"):
            body["tool_choice"] = self.choice
        elif self.choice != "absent":
            body["tool_choice"] = {"type": "function", "function": {"name": self.choice}}
        return body


@st.composite
def bad_tools(draw: st.DrawFn) -> BadTools:
    num_tools = draw(st.integers(1, 4))
    bad_indexes = draw(st.sets(st.integers(0, num_tools - 1), min_size=1))
    bad = {i: draw(st.one_of(refused_schemas(), st.just(UNSUPPORTED_TYPE))) for i in sorted(bad_indexes)}
    parameters = [bad[i].schema if i in bad else draw(object_schemas(1)) for i in range(num_tools)]
    choices = ["absent", "auto", "none", "required", *(f"tool_{i}" for i in range(num_tools))]
    return BadTools(parameters, bad, draw(st.sampled_from(choices)))
