"""One way to reject bad input: `InvalidInput`, which names the field the way the request does and says why
(`Refusal`); and `QueueFullError`, for input refused only because a queue is full.

The reason, not the message, is what a caller decides on (the server's status, the gateway's HTTP status):
the words may change, the reason may not."""

from __future__ import annotations

import enum


class Refusal(enum.Enum):
    """Why the engine refused a request."""

    INVALID_VALUE = "invalid_value"  # a value the request may not have (the default)
    CONTEXT_LENGTH = "context_length"  # the prompt (or prompt + max_tokens) over the context or a prompt-size bound
    OVER_LIMIT = "over_limit"  # over an operator's limit that is not the prompt's size (max_output_tokens)
    DUPLICATE_ID = "duplicate_id"  # a request id already in flight
    DOES_NOT_COMPILE = "does_not_compile"  # a constraint (or a tool's parameters) the grammar compiler refuses
    QUEUE_FULL = "queue_full"  # a bounded queue is full: retry later (QueueFullError)
    TEMPLATE_FAILED = "template_failed"  # the chat template raised or ran past its time bound on these messages


class InvalidInput(ValueError):  # noqa: N818 (a ValueError: callers that catch ValueError keep working)
    """Bad input. `field` names it (`sampling.max_tokens`, `messages[1].role`); str() is "field: message";
    `reason` says why, for callers (the message is for people)."""

    def __init__(self, field: str, message: str, reason: Refusal = Refusal.INVALID_VALUE) -> None:
        super().__init__(f"{field}: {message}")
        self.field, self.message, self.reason = field, message, reason

    def within(self, parent: str) -> InvalidInput:
        """The same error, its field inside `parent` (`top_p` -> `sampling.top_p`)."""
        return InvalidInput(f"{parent}.{self.field}", self.message, self.reason)

    def renamed(self, field: str) -> InvalidInput:
        return InvalidInput(field, self.message, self.reason)

    def because(self, reason: Refusal) -> InvalidInput:
        """The same error, for this reason."""
        return InvalidInput(self.field, self.message, reason)


class QueueFullError(RuntimeError):
    """A bounded queue (waiting requests, long prompts, grammar compiles) is full: retry later."""

    reason = Refusal.QUEUE_FULL


def check(field: str, ok: bool, message: str, reason: Refusal = Refusal.INVALID_VALUE) -> None:
    if not ok:
        raise InvalidInput(field, message, reason)
