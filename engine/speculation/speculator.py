"""Who drafts and how many, before each step is scheduled."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from infer.engine.speculation.proposer import Proposer
from infer.engine.speculation.state import SpecState

if TYPE_CHECKING:
    from infer.engine.request import Request


class Speculator:
    """Proposes each running request's drafts before a step is scheduled: a request's cap (its
    `speculative_tokens`, else the engine's), none while more than `max_num_seqs` requests run, and per request
    a number that grows while drafts are accepted and shrinks when they are not; at low acceptance it pauses
    drafting, for longer each time (`SpecState`)."""

    def __init__(self, proposer: Proposer, default_tokens: int, max_num_seqs: int, max_model_len: int) -> None:
        self.proposer, self.default_tokens = proposer, default_tokens
        self.max_num_seqs, self.max_model_len = max_num_seqs, max_model_len

    def max_drafts(self, r: Request) -> int:
        """A request's cap: its own setting, else the engine's; 0 (off) for a constrained request.
        NOTE: a grammar matcher would have to advance over drafts and roll back; not done yet."""
        if r.params.constraint is not None:
            return 0
        wanted = r.params.speculative_tokens
        return self.default_tokens if wanted is None else wanted

    def new_state(self, r: Request) -> SpecState | None:
        """A request's drafting state as it is taken in (None: it does not speculate)."""
        max_drafts = self.max_drafts(r)
        return SpecState(max_drafts, max_drafts) if max_drafts > 0 else None

    def drafts(self, running: Sequence[Request], states: Sequence[SpecState | None]) -> dict[str, list[int]]:
        """The drafts of each running request that drafts this step, by request id (none while the batch is
        large): the scheduler asks for them, and schedules them as far as its budget and blocks allow."""
        if len(running) > self.max_num_seqs:
            return {}
        proposed = {r.request_id: self._drafts(r, state) for r, state in zip(running, states, strict=True)
                    if state is not None}  # fmt: skip
        return {rid: d for rid, d in proposed.items() if d}

    def _drafts(self, r: Request, state: SpecState) -> list[int]:
        if r.num_tokens_to_compute != 1:  # a prefill in progress
            return []
        if state.pause_steps > 0:
            state.pause_steps -= 1
            return []
        # NOTE: one token more than the drafts comes out; no more than max_tokens or max_model_len allow
        room = self.max_model_len - r.num_tokens - 1
        if r.params.max_tokens is not None:
            room = min(room, r.params.max_tokens - r.num_output_tokens - 1)
        return self.proposer.propose(r.all_token_ids, min(state.num_drafts, room))
