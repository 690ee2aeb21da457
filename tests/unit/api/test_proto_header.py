"""The contract says itself: the proto's header names every status code the server ends a call with, every
`infer-error-reason` with the code it comes with, and the trailing metadata keys; all collected from the code."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import grpc

from infer.api import ERROR_REASON_KEY, INVALID_FIELD_KEY, RETRY_AFTER_KEY, ErrorReason
from infer.api.codegen import PROTO_PACKAGE, PROTO_ROOT
from infer.engine import InvalidInput, QueueFullError, Refusal
from infer.server.budgets import BudgetExceededError
from infer.server.lifecycle import NotServingError
from infer.server.status import status_of

ROOT = Path(__file__).resolve().parents[3]
PROTO = PROTO_ROOT / PROTO_PACKAGE / "inference.proto"
# a line of the header's table: "//   CODE / REASON  when", the reason "-" for none
ROW = re.compile(r"^//\s+([A-Z_]+) / ([A-Z_]+|-)\s{2,}\S")


def _header(text: str) -> list[str]:
    """The comment lines before `syntax`."""
    lines = text.splitlines()
    return lines[: next(i for i, line in enumerate(lines) if line.startswith("syntax"))]


def _rows(header: list[str]) -> set[tuple[str, str | None]]:
    """(code, reason or None) of every row of the header's table."""
    found = (ROW.match(line) for line in header)
    return {(m[1], None if m[2] == "-" else m[2]) for m in found if m}


def _emitted_reasons() -> set[tuple[str, str]]:
    """(code, reason) of every refusal `status_of` makes: each engine reason of bad input (a full queue is its own
    error), and the server's own errors."""
    bad_input = [refusal for refusal in Refusal if refusal is not QueueFullError.reason]
    errors: list[Exception] = [InvalidInput("prompt", "m", refusal) for refusal in bad_input]
    errors += [ValueError("m"), QueueFullError("m"), BudgetExceededError("t", 60, 1), NotServingError("m")]
    statuses = [status_of(e) for e in errors]
    return {(s.code.name, s.reason.value) for s in statuses if s.reason is not None}


def _codes_in_server() -> set[str]:
    """Every `grpc.StatusCode.X` the server's own code names (the gateway's only map the codes it receives)."""
    files = [p for p in (ROOT / "server").rglob("*.py") if "gateway" not in p.parts]
    assert len(files) > 10
    trees = [ast.parse(p.read_text(), str(p)) for p in files]
    return {
        node.attr
        for tree in trees
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "StatusCode"
        and isinstance(node.value.value, ast.Name)
        and node.value.value.id == "grpc"
    }


def test_every_reason_is_in_the_header_beside_the_code_it_comes_with() -> None:
    rows = _rows(_header(PROTO.read_text()))
    emitted = _emitted_reasons()
    assert {reason for _, reason in emitted} == {r.value for r in ErrorReason}  # the server sends every reason
    assert emitted - rows == set(), "add these (code / reason) rows to the proto's header"
    said = {(code, reason) for code, reason in rows if reason is not None}
    assert said - emitted == set(), "the header pairs these reasons with a code the server does not send them with"


def test_every_code_the_server_ends_a_call_with_is_in_the_header() -> None:
    codes = _codes_in_server()
    assert {"INVALID_ARGUMENT", "UNAUTHENTICATED", "DEADLINE_EXCEEDED"} <= codes  # the scan sees the server's codes
    said = {code for code, _ in _rows(_header(PROTO.read_text()))}
    assert codes - said == set(), "add these codes to the proto's header"
    assert said <= set(grpc.StatusCode.__members__), "the header names a code gRPC does not have"


def test_the_header_names_the_trailing_metadata_keys() -> None:
    header = "\n".join(_header(PROTO.read_text()))
    assert all(key in header for key in (ERROR_REASON_KEY, INVALID_FIELD_KEY, RETRY_AFTER_KEY))


def test_a_reason_or_code_missing_from_a_header_is_found() -> None:
    header = _header(PROTO.read_text())
    without_budget = [line for line in header if "/ BUDGET_EXCEEDED" not in line]
    assert ("RESOURCE_EXHAUSTED", "BUDGET_EXCEEDED") in _emitted_reasons() - _rows(without_budget)
    without_auth = [line for line in header if not line.startswith("//   UNAUTHENTICATED")]
    assert "UNAUTHENTICATED" not in {code for code, _ in _rows(without_auth)}
