"""JSON schemas as xgrammar enforces them: a schema is checked before it compiles, and its grammar is
corrected where xgrammar gets JSON wrong.

xgrammar 0.2.8 skips some keywords (a warning on stderr at most) and the output then need not validate.
`check_schema` refuses every keyword, `$ref` form and combination that the grammar would not enforce,
naming it and where it is (`#/properties/a: not is not enforced ...`); the list is in docs/api.md, and
tests/unit/engine/test_structured_schema.py tries each one against xgrammar. Unknown keywords are
ignored, as JSON Schema says. `$ref`s are local JSON pointers only: nothing is ever fetched.

`json_schema_grammar` is the EBNF that a checked schema compiles from. NOTE: xgrammar writes a string with
`minLength`/`maxLength` as a repetition of `[^"\\\r\n]`, which lets raw control characters through (invalid
JSON) and refuses every escape; each such rule is rewritten to JSON's characters and escapes, as whole UTF-8
characters (its negated classes take the three bytes of a UTF-16 surrogate, which decode to three U+FFFD). And it
enforces some formats loosely (a date's day 01-31 in any month, year 0000; an ipv4 octet's leading zeros; a leap
second at any minute): those are compiled from exact patterns instead.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from infer.engine.validation import InvalidInput, Refusal

# keywords that constrain nothing (annotations), and those that tell where the others live
ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "$comment", "deprecated", "readOnly", "writeOnly",
    "contentEncoding", "contentMediaType", "contentSchema", "$schema", "$anchor", "$dynamicAnchor",
    "$defs", "definitions", "$id",
})  # fmt: skip
NUMBER_KEYWORDS = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})
STRING_KEYWORDS = frozenset({"minLength", "maxLength", "pattern", "format"})
ARRAY_KEYWORDS = frozenset({"items", "prefixItems", "minItems", "maxItems", "unevaluatedItems"})
OBJECT_KEYWORDS = frozenset({
    "properties", "required", "additionalProperties", "patternProperties", "propertyNames",
    "minProperties", "maxProperties", "unevaluatedProperties",
})  # fmt: skip
# without "type", xgrammar takes a schema with one of these for an object (an array); otherwise for any value
OBJECT_MARKERS = frozenset({"properties", "additionalProperties", "unevaluatedProperties"})
ARRAY_MARKERS = frozenset({"items", "prefixItems", "unevaluatedItems"})
NEVER_ENFORCED = {
    "not": "not",
    "if": "if/then/else",
    "then": "if/then/else",
    "else": "if/then/else",
    "contains": "contains (and minContains/maxContains)",
    "dependentRequired": "dependentRequired",
    "dependentSchemas": "dependentSchemas",
    "dependencies": "dependencies",
    "additionalItems": "additionalItems (use prefixItems and items)",
    "$dynamicRef": "$dynamicRef",
    "$recursiveRef": "$recursiveRef",
}
COMBINATORS = ("anyOf", "oneOf", "allOf", "$ref", "enum", "const")
FORMATS = frozenset({
    "date", "time", "date-time", "duration", "email", "hostname", "ipv4", "ipv6", "uri", "uri-reference",
    "uuid",
})  # fmt: skip
TYPES = frozenset({"string", "number", "integer", "boolean", "null", "array", "object"})


def check_schema(schema: Any, field: str) -> None:
    """InvalidInput naming `field`, the keyword and its place when the schema asks for what would not be
    enforced (`does not compile: #/properties/a: not is not enforced ...`)."""
    for path, node in _nodes(schema, field):
        message = _problem(node, path == "#")
        if message is not None:
            raise InvalidInput(field, f"does not compile: {path}: {message}", Refusal.DOES_NOT_COMPILE)
    for path, node in _nodes(schema, field):
        if isinstance(node.get("oneOf"), list) and not _disjoint(schema, node["oneOf"]):
            message = "oneOf is enforced only when no value can match two of its schemas (different types, "
            raise InvalidInput(
                field,
                f"does not compile: {path}: {message}or a required property of different const values)",
                Refusal.DOES_NOT_COMPILE,
            )


def _nodes(schema: Any, field: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(JSON pointer, schema) of every object subschema; NOTE: a stack, not recursion (a schema may nest deep)."""
    stack: list[tuple[str, Any]] = [("#", schema)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, bool):
            continue
        if not isinstance(node, dict):
            raise InvalidInput(
                field, f"does not compile: {path}: a schema must be an object or a boolean", Refusal.DOES_NOT_COMPILE
            )
        yield path, node
        for key, child in _children(node):
            stack.append((f"{path}/{key}", child))


def _children(node: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    for key in ("additionalProperties", "unevaluatedProperties", "unevaluatedItems", "not", "if", "then", "else",
                "contains"):  # fmt: skip
        if key in node:
            yield key, node[key]
    names = node.get("propertyNames")
    if isinstance(names, dict) and not any(k in names for k in ("type", *COMBINATORS)):
        names = {"type": "string", **names}  # a property name is a string
    if names is not None:
        yield "propertyNames", names
    if isinstance(node.get("items"), dict | bool):
        yield "items", node["items"]
    for key in ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas"):
        if isinstance(node.get(key), dict):
            for name, child in node[key].items():
                yield f"{key}/{_escaped(name)}", child
    for key in ("prefixItems", "anyOf", "oneOf", "allOf"):
        if isinstance(node.get(key), list):
            for i, child in enumerate(node[key]):
                yield f"{key}/{i}", child


def _escaped(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def _problem(node: dict[str, Any], is_root: bool) -> str | None:
    """Why this schema (not its subschemas) would not be enforced; None when it would."""
    for key in node:
        if key in NEVER_ENFORCED:
            return f"{NEVER_ENFORCED[key]} is not enforced by constrained decoding"
    if node.get("uniqueItems") is True:
        return "uniqueItems is not enforced by constrained decoding"
    if isinstance(node.get("items"), list):
        return "items as a list is not supported: use prefixItems"
    if "$id" in node and not is_root:
        return "$id is only supported at the root ($refs resolve from the root)"
    return _ref_problem(node) or _combination_problem(node) or _typed_problem(node) or _pattern_keys_problem(node)


def _ref_problem(node: dict[str, Any]) -> str | None:
    ref = node.get("$ref")
    if ref is None:
        return None
    if not isinstance(ref, str):
        return "$ref must be a string"
    if not (ref == "#" or ref.startswith("#/")):
        kind = "a remote" if "#" not in ref[:1] else "an anchor"
        return f"$ref {ref[:100]!r} is {kind} reference: only local ones (#/$defs/...) are supported, none is fetched"
    if "~" in ref:
        return f"$ref {ref[:100]!r}: JSON pointer escapes (~0, ~1) are not supported"
    return None


def _constraints(node: dict[str, Any]) -> list[str]:
    """The keywords of this schema that constrain a value (not annotations, not unknown ones)."""
    known = NUMBER_KEYWORDS | STRING_KEYWORDS | ARRAY_KEYWORDS | OBJECT_KEYWORDS | {"type", *COMBINATORS}
    return [k for k in node if k in known]


def _combination_problem(node: dict[str, Any]) -> str | None:
    combinator = next((k for k in COMBINATORS if k in node), None)
    if combinator is None:
        return None
    allowed = {combinator, "type"} if combinator in ("enum", "const") else {combinator}
    beside = [k for k in _constraints(node) if k not in allowed]
    if beside:
        return f"{beside[0]} beside {combinator} is not enforced (move it into the {combinator} schema)"
    if combinator == "allOf" and isinstance(node["allOf"], list) and len(node["allOf"]) > 1:
        return "allOf of more than one schema is not enforced (merge them into one schema)"
    if combinator in ("enum", "const") and "type" in node:
        values = node["enum"] if combinator == "enum" else [node["const"]]
        types = _types(node) | ({"integer"} if "number" in _types(node) else set())  # an integer is a number
        wrong = [v for v in values if _type_of(v) not in types] if isinstance(values, list) else []
        if wrong:
            return f"{combinator} value {json.dumps(wrong[0])[:60]} is not of the schema's type (it would be output)"
    return None


def _typed_problem(node: dict[str, Any]) -> str | None:
    """Keywords of a type: the type they need, multipleOf, formats, patterns and lengths of strings."""
    types = _types(node) if "type" in node else _inferred_types(node)
    if types is None:
        keyword = next(k for k in _constraints(node) if k != "type")
        return f'{keyword} needs a type (xgrammar enforces it only beside "type")'
    step = node.get("multipleOf")
    is_whole = isinstance(step, int) and not isinstance(step, bool) and step > 0
    if step is not None and types & {"integer", "number"} and ("number" in types or not is_whole):
        return 'multipleOf is enforced only for "type": "integer" with a positive integer'
    if "string" not in types:
        return None
    string_keywords = [k for k in ("pattern", "format", "minLength", "maxLength") if k in node]
    if len(string_keywords) > 1 and string_keywords[0] in ("pattern", "format"):
        return f"{string_keywords[0]} together with {string_keywords[1]} is not enforced (only one of them would be)"
    if "format" in node and node["format"] not in FORMATS:
        return f"format {str(node['format'])[:40]!r} is not enforced; these are: {', '.join(sorted(FORMATS))}"
    return _pattern_problem(node.get("pattern"), "pattern")


def _types(node: dict[str, Any]) -> frozenset[str]:
    declared = node["type"]
    return frozenset(t for t in (declared if isinstance(declared, list) else [declared]) if isinstance(t, str))


def _inferred_types(node: dict[str, Any]) -> frozenset[str] | None:
    """What xgrammar takes a schema without "type" for; None when it would not enforce its keywords."""
    keys = set(_constraints(node)) - set(COMBINATORS)
    if not keys:
        return TYPES
    is_object, is_array = bool(keys & OBJECT_MARKERS), bool(keys & ARRAY_MARKERS)
    if is_object and not is_array and keys <= OBJECT_KEYWORDS:
        return frozenset({"object"})
    if is_array and not is_object and keys <= ARRAY_KEYWORDS:
        return frozenset({"array"})
    return None


def _type_of(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"
    return {float: "number", str: "string", list: "array", dict: "object"}.get(type(value), "null")


# --- regular expressions: xgrammar writes a literal character of a pattern as it is, unescaped

_ESCAPED_LITERAL = re.compile(r'\\(["\\tnrfv0]|c[A-Za-z]|x([0-9A-Fa-f]{2})|u([0-9A-Fa-f]{4})|u\{([0-9A-Fa-f]+)\})')


def _pattern_problem(pattern: Any, keyword: str) -> str | None:
    """A pattern with a literal `"`, `\\` or control character outside a [class]: xgrammar would write it raw,
    which is not JSON. (In a class, xgrammar leaves them out.)"""
    if not isinstance(pattern, str):
        return None
    problem = f"{keyword} {pattern[:60]!r}: a literal '\"', '\\\\' or control character is not supported"
    i, in_class = 0, False
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            match = _ESCAPED_LITERAL.match(pattern, i)
            if match and not in_class and _needs_escape(match):
                return problem
            i += len(match.group(0)) if match else 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
        elif char == '"' or ord(char) < 0x20:
            return problem
        i += 1
    return None


def _needs_escape(match: re.Match[str]) -> bool:
    code = match.group(2) or match.group(3) or match.group(4)
    return code is None or int(code, 16) < 0x20 or int(code, 16) in (0x22, 0x5C)


def _pattern_keys_problem(node: dict[str, Any]) -> str | None:
    keys = node.get("patternProperties")
    if not isinstance(keys, dict):
        return None
    return next((p for k in keys if (p := _pattern_problem(k, "patternProperties key")) is not None), None)


# --- oneOf: exactly one schema matches, which xgrammar's anyOf enforces when no value can match two


def _disjoint(root: Any, options: list[Any]) -> bool:
    resolved = [_resolve(root, option) for option in options]
    return all(_apart(a, b) for i, a in enumerate(resolved) for b in resolved[i + 1 :])


def _apart(a: Any, b: Any) -> bool:
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return False
    types_a, types_b = _value_types(a), _value_types(b)
    if not types_a & types_b:
        return True
    if types_a != {"object"} or types_b != {"object"}:
        return False
    required = set(_strings(a.get("required"))) & set(_strings(b.get("required")))
    for name in required:
        values_a, values_b = _values(a, name), _values(b, name)
        if values_a is not None and values_b is not None and not values_a & values_b:
            return True
    return False


def _strings(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _value_types(node: dict[str, Any]) -> frozenset[str]:
    if "const" in node:
        return frozenset({_type_of(node["const"])})
    if isinstance(node.get("enum"), list):
        return frozenset(_type_of(v) for v in node["enum"])
    if "type" in node:
        types = _types(node)
        return types | {"integer"} if "number" in types else types
    return _inferred_types(node) or TYPES


def _values(node: dict[str, Any], name: str) -> set[str] | None:
    """The JSON texts a property may take when it is a const or an enum; None when it is open."""
    prop = node.get("properties", {}).get(name) if isinstance(node.get("properties"), dict) else None
    if isinstance(prop, dict) and "const" in prop:
        return {json.dumps(prop["const"], sort_keys=True)}
    if isinstance(prop, dict) and isinstance(prop.get("enum"), list):
        return {json.dumps(v, sort_keys=True) for v in prop["enum"]}
    return None


def _resolve(root: Any, node: Any) -> Any:
    """A local $ref followed (a few hops at most); what it points at, or None when it points nowhere."""
    for _ in range(8):
        if not (isinstance(node, dict) and isinstance(node.get("$ref"), str)):
            return node
        parts = [p for p in node["$ref"].removeprefix("#").split("/") if p]
        node = root
        for part in parts:
            node = node.get(part) if isinstance(node, dict) else None
    return None


# --- the grammar

# NOTE: a length-bounded string's character as xgrammar 0.2.8 writes it: `[^"\\\r\n]` (raw control characters
# in, every escape out). Rewritten to a JSON string's character: anything but `"`, `\` and U+0000-U+001F, or
# an escape; a `\u` escape of a surrogate only as a pair, so that each character counts one towards the length.
# The class is written as ranges without the surrogates: a negated class takes their bytes
_LENGTH_BOUNDED_CHAR = '[^\\"\\\\\\r\\n]'
_JSON_CHAR = r'(([ !#-\[\]-\ud7ff\ue000-\U0010ffff]) | ("\\" {escape}))'
_HEX = "[0-9A-Fa-f]"
_SURROGATE_PAIR = rf'"u" [Dd] [89ABab] {_HEX} {_HEX} "\\u" [Dd] [C-Fc-f] {_HEX} {_HEX}'
_JSON_ESCAPE = (rf'{{escape}} ::= ([\"\\/bfnrt] | ("u" [0-9A-Ca-cEFef] {_HEX} {_HEX} {_HEX})'
                rf' | ("u" [Dd] [0-7] {_HEX} {_HEX}) | ({_SURROGATE_PAIR}))')  # fmt: skip


# formats xgrammar 0.2.8 enforces loosely, as patterns that take only valid values (NOTE: no leap second: whether
# 23:59:60 is one depends on the time zone)
_YEAR = "(000[1-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-9][0-9]{3})"
_MONTH_DAY = "((0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])|(0[13-9]|1[0-2])-(29|30)|(0[13578]|1[02])-31)"
_LEAP_DAY = "([0-9]{2}(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)-02-29"
_DATE = f"({_YEAR}-{_MONTH_DAY}|{_LEAP_DAY})"
_TIME = "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]+)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
_OCTET = "(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
EXACT_FORMATS = {"date": _DATE, "time": _TIME, "date-time": f"{_DATE}T{_TIME}", "ipv4": f"{_OCTET}(\\.{_OCTET}){{3}}"}


def _exact_formats(schema: str) -> str:
    """The schema with each format of EXACT_FORMATS as its pattern (a checked schema has no other string keyword
    beside a format)."""
    root = json.loads(schema)
    nodes = [node for _, node in _nodes(root, "json_schema") if _is_exact_format(node)]
    for node in nodes:
        node["pattern"] = f"^{EXACT_FORMATS[node.pop('format')]}$"
    return json.dumps(root) if nodes else schema


def _is_exact_format(node: dict[str, Any]) -> bool:
    form = node.get("format")
    return isinstance(form, str) and form in EXACT_FORMATS and "type" in node and "string" in _types(node)


def json_schema_grammar(schema: str) -> str:
    """The EBNF of a JSON schema's output (`{"a": 1, "b": 2}`: no free whitespace, no properties or items
    that the schema does not name); RuntimeError (xgrammar's) when it does not convert."""
    import xgrammar as xgr

    ebnf = str(xgr.Grammar.from_json_schema(_exact_formats(schema), any_whitespace=False, strict_mode=True))
    if _LENGTH_BOUNDED_CHAR not in ebnf:
        return ebnf
    escape = "infer_json_escape"
    while escape in ebnf:
        escape += "_"
    fixed = ebnf.replace(_LENGTH_BOUNDED_CHAR, _JSON_CHAR.format(escape=escape))
    return fixed + "\n" + _JSON_ESCAPE.format(escape=escape) + "\n"
