"""One way to reject bad input: `InvalidInput`, which names the field the way the request does; and
`QueueFullError`, for input refused only because a queue is full."""

from __future__ import annotations


class InvalidInput(ValueError):  # noqa: N818 (a ValueError: callers that catch ValueError keep working)
    """Bad input. `field` names it (`sampling.max_tokens`, `messages[1].role`); str() is "field: message"."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message

    def within(self, parent: str) -> InvalidInput:
        """The same error, its field inside `parent` (`top_p` -> `sampling.top_p`)."""
        return InvalidInput(f"{parent}.{self.field}", self.message)

    def renamed(self, field: str) -> InvalidInput:
        return InvalidInput(field, self.message)


class QueueFullError(RuntimeError):
    """A bounded queue (waiting requests, long prompts, grammar compiles) is full: retry later."""


def check(field: str, ok: bool, message: str) -> None:
    if not ok:
        raise InvalidInput(field, message)
