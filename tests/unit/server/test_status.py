"""An RPC's failure as its status: the code, the message, and the contract's trailing metadata."""

from __future__ import annotations

import grpc
import pytest

from infer.api import ERROR_REASON_KEY, INVALID_FIELD_KEY, RETRY_AFTER_KEY, ErrorReason, retry_after_s
from infer.engine import InvalidInput, QueueFullError, Refusal
from infer.server.budgets import BudgetExceededError
from infer.server.lifecycle import RETRY_AFTER_S, NotServingError
from infer.server.status import REASONS, Status, StatusError, status_of


def test_every_engine_reason_has_a_word_in_the_contract() -> None:
    assert set(REASONS) == set(Refusal)
    assert len(set(REASONS.values())) == len(Refusal)  # no two engine reasons alike on the wire


@pytest.mark.parametrize("refusal", list(Refusal))
def test_bad_input_is_invalid_argument_with_its_field_and_reason(refusal: Refusal) -> None:
    status = status_of(InvalidInput("sampling.top_p", "any words", refusal))
    assert (status.code, status.message) == (grpc.StatusCode.INVALID_ARGUMENT, "sampling.top_p: any words")
    assert status.trailing_metadata == ((INVALID_FIELD_KEY, "sampling.top_p"), (ERROR_REASON_KEY, REASONS[refusal]))


@pytest.mark.parametrize(
    ("error", "code", "reason"),
    [
        (ValueError("not an InvalidInput"), grpc.StatusCode.INVALID_ARGUMENT, ErrorReason.INVALID_VALUE),
        (QueueFullError("3 requests are waiting"), grpc.StatusCode.RESOURCE_EXHAUSTED, ErrorReason.QUEUE_FULL),
        (StatusError(grpc.StatusCode.CANCELLED, "aborted"), grpc.StatusCode.CANCELLED, None),
        (RuntimeError("a bug"), grpc.StatusCode.INTERNAL, None),
    ],
)
def test_other_failures_carry_a_reason_only_where_the_code_leaves_one_open(
    error: Exception, code: grpc.StatusCode, reason: ErrorReason | None
) -> None:
    status = status_of(error)
    assert (status.code, status.reason) == (code, reason)
    assert status.trailing_metadata == (() if reason is None else ((ERROR_REASON_KEY, reason.value),))


def test_not_serving_says_its_reason_and_when_to_try_again() -> None:
    """While the server loads or drains (the same hint a draining server's refuser gives a new connection)."""
    status = status_of(NotServingError("not serving: the server is shutting down"))
    assert (status.code, status.reason, status.retry_after_s) == (
        grpc.StatusCode.UNAVAILABLE,
        ErrorReason.NOT_SERVING,
        RETRY_AFTER_S,
    )
    assert retry_after_s(status.trailing_metadata) == RETRY_AFTER_S


def test_a_status_without_reason_or_field_sends_no_metadata() -> None:
    assert Status(grpc.StatusCode.DEADLINE_EXCEEDED, "late").trailing_metadata == ()


def test_a_spent_budget_says_its_reason_and_when_to_retry() -> None:
    status = status_of(BudgetExceededError("light", 600, 7))
    assert (status.code, status.reason, status.retry_after_s) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        ErrorReason.BUDGET_EXCEEDED,
        7,
    )
    assert status.trailing_metadata == ((ERROR_REASON_KEY, "BUDGET_EXCEEDED"), (RETRY_AFTER_KEY, "7"))
    assert retry_after_s(status.trailing_metadata) == 7 and retry_after_s(()) is None
