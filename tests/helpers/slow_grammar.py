"""A grammar that compiles slowly but boundedly, and a record of what the server compiled itself."""

from __future__ import annotations

from typing import Any

import pytest

from infer.engine.structured import Constraint
from infer.engine.structured import compiler as structured

# ~1.5 s of CPU to compile on the tiny tokenizer: long enough to leave during, short enough for a unit test
SLOW_GRAMMAR = Constraint.grammar("root ::= " + " ".join('("a" | "bc" | [0-9])' for _ in range(3000)))


def record_compiles(monkeypatch: pytest.MonkeyPatch) -> list[Constraint]:
    """The constraints compiled in this process from now on (trials in the worker process are not)."""
    seen: list[Constraint] = []
    compile_one = structured._compile

    def recording(backend: Any, constraint: Constraint) -> Any:
        seen.append(constraint)
        return compile_one(backend, constraint)

    monkeypatch.setattr(structured, "_compile", recording)
    return seen
