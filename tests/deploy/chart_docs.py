"""The values table of charts/infer/README.md, built from values.yaml and its `# --` comments.

A `# -- text` comment (continued by the `# ...` lines under it) documents the key on the next line; a
documented map is one value (resources, affinity, ...). Print the table: `python -m tests.deploy.chart_docs`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

VALUES = Path(__file__).resolve().parents[2] / "charts" / "infer" / "values.yaml"
_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w.-]*):")
_DOC = re.compile(r"^(?P<indent> *)# -- (?P<text>.*)$")
_MORE = re.compile(r"^(?P<indent> *)# (?P<text>.*)$")


@dataclass(frozen=True)
class Value:
    path: str  # dotted: `model.pvc.claimName`
    default: Any
    doc: str


def documented_values(text: str | None = None) -> list[Value]:
    """Every documented key of values.yaml, in file order."""
    text = VALUES.read_text() if text is None else text
    data = yaml.safe_load(text)
    stack: list[tuple[int, str]] = []  # (indent, key) of the enclosing maps
    doc: list[str] = []
    values: list[Value] = []
    for line in text.splitlines():
        if m := _DOC.match(line):
            doc = [m["text"]]
        elif doc and (m := _MORE.match(line)):
            doc.append(m["text"])
        elif m := _KEY.match(line):
            indent = len(m["indent"])
            stack = [(i, k) for i, k in stack if i < indent] + [(indent, m["key"])]
            if doc:
                path = [k for _, k in stack]
                values.append(Value(".".join(path), _lookup(data, path), " ".join(doc)))
            doc = []
    return values


def _lookup(data: Any, path: list[str]) -> Any:
    for key in path:
        data = data[key]
    return data


def leaf_paths(data: Any, prefix: str = "") -> list[str]:
    """Dotted paths of every scalar, list and empty map in a values tree."""
    if isinstance(data, dict) and data:
        return [p for key, value in data.items() for p in leaf_paths(value, f"{prefix}{key}.")]
    return [prefix.rstrip(".")]


def _show(value: Any) -> str:
    if isinstance(value, str):
        return f'`"{value}"`'
    return f"`{json.dumps(value, separators=(', ', ': '))}`"


def values_table() -> str:
    rows = ["| value | default | meaning |", "|---|---|---|"]
    rows += [f"| `{v.path}` | {_show(v.default)} | {v.doc} |" for v in documented_values()]
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(values_table(), end="")
