"""One request's grammar: compiling, then a matcher over its output (`Request.grammar`).

It imports nothing that imports `Request`, so the request names its type without importing the manager that
works on requests (`manager.StructuredOutputs` makes these and walks them)."""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import xgrammar as xgr

    from infer.engine.structured.constraint import Constraint


class GrammarState:
    """One request's grammar: compiling, then a matcher over the output so far."""

    def __init__(self, constraint: Constraint, future: Future[xgr.CompiledGrammar]) -> None:
        self.constraint, self.future = constraint, future
        self.matcher: xgr.GrammarMatcher | None = None

    @property
    def is_compiled(self) -> bool:
        return self.future.done()

    def start(self) -> None:
        """The matcher, once compiled; raises the compile error (a ValueError naming the kind)."""
        import xgrammar as xgr

        self.matcher = xgr.GrammarMatcher(self.future.result())

    def accept(self, token_id: int) -> bool:
        """Advance over a sampled token; False when the grammar does not allow it (the mask was not applied)."""
        assert self.matcher is not None, "start() first"
        return bool(self.matcher.accept_token(token_id))

    @property
    def is_terminated(self) -> bool:
        """The grammar is complete and took its stop token, or can take nothing more: the request is done."""
        return self.matcher is not None and bool(self.matcher.is_terminated())
