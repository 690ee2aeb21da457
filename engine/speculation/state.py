"""One request's drafting state and the bounds of speculation: a leaf (the request and the settings hold it)."""

from __future__ import annotations

from dataclasses import dataclass

MAX_SPECULATIVE_TOKENS = 16  # drafts per request per step, at most
LOW_ACCEPTANCE = 0.3  # below this (a moving average of accepted / drafted), drafting pauses
MAX_PAUSE_STEPS = 64  # the longest pause; each pause in a row doubles, up to this
EMA_WEIGHT = 0.3  # weight of the newest step in the acceptance average


@dataclass
class SpecState:
    """One request's drafting: how many drafts it takes now, and how well they have done."""

    max_drafts: int  # the request's cap
    num_drafts: int  # drafts proposed next time (adapts in 1..max_drafts)
    acceptance_ema: float = 1.0
    pause_steps: int = 0  # steps left without drafts
    next_pause_steps: int = 1

    def record(self, num_drafts: int, num_accepted: int) -> None:
        """Adapt after a verification: more drafts while all are accepted; pause at low acceptance."""
        if num_drafts == 0:
            return
        self.num_drafts = min(self.max_drafts, self.num_drafts + 1) if num_accepted == num_drafts else num_accepted + 1
        rate = num_accepted / num_drafts
        self.acceptance_ema = (1 - EMA_WEIGHT) * self.acceptance_ema + EMA_WEIGHT * rate
        if self.acceptance_ema < LOW_ACCEPTANCE:
            self.pause_steps, self.acceptance_ema = self.next_pause_steps, 2 * LOW_ACCEPTANCE  # then a new trial
            self.next_pause_steps = min(2 * self.next_pause_steps, MAX_PAUSE_STEPS)
        elif num_accepted > 0:
            self.next_pause_steps = 1
