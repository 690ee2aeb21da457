"""The proposer interface: who guesses the tokens a request's drafts carry."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Proposer(Protocol):
    """Proposes the tokens that may follow a sequence (a request's prompt + output). A new proposer (a small
    draft model, say) is a class with this method in a module of its own; the `Speculator` takes any."""

    def propose(self, token_ids: Sequence[int], max_tokens: int) -> list[int]:
        """Up to max_tokens guessed next tokens (none when it has no guess)."""
        ...
