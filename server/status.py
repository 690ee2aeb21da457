"""How an RPC ends when it fails: the exception as a gRPC status code, a message for people, and the contract's
trailing metadata (`infer.api`): the reason (ERROR_REASON_KEY), for bad input the field (INVALID_FIELD_KEY), and
for a spent token budget or a server not serving the seconds to wait (RETRY_AFTER_KEY).
Callers decide on the code and the reason, never on the message."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import grpc

from infer.api import ERROR_REASON_KEY, INVALID_FIELD_KEY, RETRY_AFTER_KEY, ErrorReason
from infer.engine import InvalidInput, QueueFullError, Refusal
from infer.server.budgets import BudgetExceededError
from infer.server.lifecycle import RETRY_AFTER_S, NotServingError

logger = logging.getLogger(__name__)

# the engine's reasons in the contract's words
REASONS = {
    Refusal.INVALID_VALUE: ErrorReason.INVALID_VALUE,
    Refusal.CONTEXT_LENGTH: ErrorReason.CONTEXT_LENGTH_EXCEEDED,
    Refusal.OVER_LIMIT: ErrorReason.OVER_LIMIT,
    Refusal.DUPLICATE_ID: ErrorReason.DUPLICATE_REQUEST_ID,
    Refusal.DOES_NOT_COMPILE: ErrorReason.DOES_NOT_COMPILE,
    Refusal.QUEUE_FULL: ErrorReason.QUEUE_FULL,
    Refusal.TEMPLATE_FAILED: ErrorReason.CHAT_TEMPLATE_FAILED,
}


class StatusError(Exception):
    """End the RPC with this status code and message."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


@dataclass(frozen=True)
class Status:
    code: grpc.StatusCode
    message: str
    reason: ErrorReason | None = None
    field: str | None = None  # the request field at fault (INVALID_ARGUMENT)
    retry_after_s: int | None = None  # when the call would be let in (BUDGET_EXCEEDED), or to try again (NOT_SERVING)

    @property
    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        field = () if self.field is None else ((INVALID_FIELD_KEY, self.field),)
        reason = () if self.reason is None else ((ERROR_REASON_KEY, self.reason.value),)
        return field + reason + (() if self.retry_after_s is None else ((RETRY_AFTER_KEY, str(self.retry_after_s)),))


def status_of(error: Exception) -> Status:
    """NOTE: InvalidInput is a ValueError: INVALID_ARGUMENT, with its field and reason."""
    if isinstance(error, StatusError):
        return Status(error.code, error.message)
    if isinstance(error, InvalidInput):
        return Status(grpc.StatusCode.INVALID_ARGUMENT, str(error), REASONS[error.reason], error.field)
    if isinstance(error, ValueError):
        return Status(grpc.StatusCode.INVALID_ARGUMENT, str(error), ErrorReason.INVALID_VALUE)
    if isinstance(error, QueueFullError):
        return Status(grpc.StatusCode.RESOURCE_EXHAUSTED, f"queue full: {error}", REASONS[error.reason])
    if isinstance(error, BudgetExceededError):
        code, reason = grpc.StatusCode.RESOURCE_EXHAUSTED, ErrorReason.BUDGET_EXCEEDED
        return Status(code, str(error), reason, retry_after_s=error.retry_after_s)
    if isinstance(error, NotServingError):
        return Status(grpc.StatusCode.UNAVAILABLE, str(error), ErrorReason.NOT_SERVING, retry_after_s=RETRY_AFTER_S)
    logger.exception("unexpected error in an RPC", exc_info=error)
    return Status(grpc.StatusCode.INTERNAL, f"internal error: {type(error).__name__}: {error}")
