"""What a request may ask its output to match: `Constraint` (JSON schema, JSON object, regex, EBNF grammar,
choice), checked when it is made; whether it compiles is `compiler.GrammarCompiler`'s to say."""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from infer.engine.structured.schema import check_schema
from infer.engine.validation import InvalidInput, check

MAX_CONSTRAINT_CHARS = 65536  # a schema, regex or grammar; choices together
MAX_CHOICES = 1024
JSON_OBJECT_SCHEMA = '{"type": "object"}'


class ConstraintKind(enum.StrEnum):
    JSON_SCHEMA = "json_schema"  # a JSON schema (JSON text)
    JSON_OBJECT = "json_object"  # any JSON object
    REGEX = "regex"
    GRAMMAR = "grammar"  # EBNF (GBNF-style: `root ::= ...`)
    CHOICE = "choice"  # exactly one of some strings


@dataclass(frozen=True)
class Constraint:
    """The output must match this. ValueError names the kind (`json_schema: ...`) when it is malformed;
    whether it compiles is the compiler's to say."""

    kind: ConstraintKind
    text: str = ""  # the schema, regex or grammar; for a choice, a JSON list of the strings; "" for json_object

    def __post_init__(self) -> None:
        try:
            kind = ConstraintKind(self.kind)
        except ValueError:
            kinds = ", ".join(k.value for k in ConstraintKind)
            raise InvalidInput("constraint", f"{str(self.kind)[:40]!r} is not one of {kinds}") from None
        object.__setattr__(self, "kind", kind)
        check(kind, len(self.text) <= MAX_CONSTRAINT_CHARS, f"at most {MAX_CONSTRAINT_CHARS} characters")
        if kind is ConstraintKind.JSON_OBJECT:
            check(kind, self.text == "", "takes no text")
        elif kind is ConstraintKind.JSON_SCHEMA:
            schema = _json(kind, self.text)
            check(kind, isinstance(schema, dict), "must be a JSON object")
            check_schema(schema, kind)  # what xgrammar would not enforce
        elif kind is ConstraintKind.CHOICE:
            choices = _json(kind, self.text)
            check(kind, isinstance(choices, list) and 0 < len(choices) <= MAX_CHOICES, f"1 to {MAX_CHOICES} strings")
            check(kind, all(isinstance(c, str) and c for c in choices), "must be non-empty strings")
        else:
            check(kind, self.text != "", "must not be empty")

    @classmethod
    def of(cls, kind: str, text: str = "") -> Constraint:
        """A constraint of the kind a string names (`"regex"`); ValueError names an unknown kind."""
        return cls(kind, text)  # type: ignore[arg-type]  # __post_init__ checks the kind and converts it

    @classmethod
    def json_schema(cls, schema: str | Mapping[str, Any]) -> Constraint:
        return cls(ConstraintKind.JSON_SCHEMA, schema if isinstance(schema, str) else json.dumps(schema))

    @classmethod
    def json_object(cls) -> Constraint:
        return cls(ConstraintKind.JSON_OBJECT)

    @classmethod
    def regex(cls, pattern: str) -> Constraint:
        return cls(ConstraintKind.REGEX, pattern)

    @classmethod
    def grammar(cls, ebnf: str) -> Constraint:
        return cls(ConstraintKind.GRAMMAR, ebnf)

    @classmethod
    def choice(cls, choices: Sequence[str]) -> Constraint:
        return cls(ConstraintKind.CHOICE, json.dumps(list(choices), ensure_ascii=False))

    @property
    def choices(self) -> list[str]:
        return list(json.loads(self.text)) if self.kind is ConstraintKind.CHOICE else []


def _json(kind: str, text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:
        raise InvalidInput(kind, f"not valid JSON: {e}") from None


def choice_grammar(choices: Sequence[str]) -> str:
    """EBNF for exactly one of `choices`. NOTE: JSON string escapes are also xgrammar's EBNF literal escapes."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)
