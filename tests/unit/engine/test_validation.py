"""InvalidInput and QueueFullError carry their reason (`Refusal`): what callers decide on, whatever the words."""

from __future__ import annotations

import pytest

from infer.engine.validation import InvalidInput, QueueFullError, Refusal, check


def test_bad_input_is_an_invalid_value_unless_it_says_otherwise() -> None:
    assert InvalidInput("top_p", "must be in (0, 1]").reason is Refusal.INVALID_VALUE
    assert InvalidInput("prompt", "too long", Refusal.CONTEXT_LENGTH).reason is Refusal.CONTEXT_LENGTH


def test_the_reason_stays_when_the_field_is_renamed_or_nested() -> None:
    error = InvalidInput("json_schema", "nope", Refusal.DOES_NOT_COMPILE)
    assert error.within("sampling").reason is Refusal.DOES_NOT_COMPILE
    assert error.renamed("tools[0].parameters").reason is Refusal.DOES_NOT_COMPILE
    moved = error.within("sampling")
    assert (moved.field, moved.message, str(moved)) == ("sampling.json_schema", "nope", "sampling.json_schema: nope")


def test_because_gives_the_same_error_another_reason() -> None:
    error = InvalidInput("regex", "bad", Refusal.INVALID_VALUE).because(Refusal.DOES_NOT_COMPILE)
    assert (error.field, error.message, error.reason) == ("regex", "bad", Refusal.DOES_NOT_COMPILE)


def test_check_raises_with_the_reason() -> None:
    check("request_id", True, "in flight", Refusal.DUPLICATE_ID)
    with pytest.raises(InvalidInput) as info:
        check("request_id", False, "in flight", Refusal.DUPLICATE_ID)
    assert info.value.reason is Refusal.DUPLICATE_ID and info.value.field == "request_id"


def test_a_full_queue_says_so() -> None:
    assert QueueFullError("3 requests are waiting").reason is Refusal.QUEUE_FULL
