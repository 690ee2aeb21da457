"""Data the tests share with the benchmarks, read from the files under benchmarks/ (one copy of each)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def parity_prompts() -> list[str]:
    """The 8 prompts whose greedy tokens bench-precision compares with transformers (parity_prompts.json)."""
    prompts: list[str] = json.loads((BENCHMARKS / "parity_prompts.json").read_text(encoding="utf-8"))
    return prompts


def structured_schemas() -> dict[str, Any]:
    """The five JSON schemas bench-structured samples under (structured_schemas.json), by name."""
    schemas: dict[str, Any] = json.loads((BENCHMARKS / "structured_schemas.json").read_text(encoding="utf-8"))
    return schemas
