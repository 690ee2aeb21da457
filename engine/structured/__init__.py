"""Structured output: what a request may ask its output to match (`constraint`), compiling it off the step
thread (`compiler`), and each request's matcher with one token bitmask per step (`manager`, imports torch).
JSON schemas are checked and turned into grammars in `schema`."""

from infer.engine.structured.compiler import DEFAULT_COMPILE_BUDGET_S, DEFAULT_MAX_PENDING_GRAMMARS, GrammarCompiler
from infer.engine.structured.constraint import MAX_CHOICES, MAX_CONSTRAINT_CHARS, Constraint, ConstraintKind

__all__ = [
    "DEFAULT_COMPILE_BUDGET_S",
    "DEFAULT_MAX_PENDING_GRAMMARS",
    "MAX_CHOICES",
    "MAX_CONSTRAINT_CHARS",
    "Constraint",
    "ConstraintKind",
    "GrammarCompiler",
]
