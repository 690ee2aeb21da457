"""Speculative decoding: drafts for decoding requests, verified in the next mixed step.

A `DraftSource` guesses up to k tokens that follow a request's tokens (`NgramDraft`: prompt lookup, the
tokens that followed the latest earlier occurrence of the sequence's last n tokens; a small draft model can
implement the same interface). The scheduler runs the request's newest token and its drafts as one short
chunk; the runner returns logits at each of its positions; the sampler samples every position as plain
decoding would (the same penalties, bans, noise; position j sees the drafts before it as output), and the
drafts are accepted while each equals what was sampled at its position. The sampled token that follows the
accepted drafts (the correction, or the bonus after all of them) is kept too, so each step emits 1 to k + 1
tokens, and the KV of rejected drafts is rolled back.

NOTE: for a sampled row, token j is argmax(p_j / E_j) with E_j ~ Exp(1) noise (the exponential race, as in
plain decoding). The draft d is accepted with probability p_j(d), and when it is not, the token drawn is
distributed as p_j with d removed, renormalised: the rejection rule for a deterministic proposal, so the
output distribution is the model's. A seeded request draws E_j from its own generator and rewinds it to the
draws it used (`rewind_generator`): the same tokens as without speculation.

`sampler.Verifier` samples a step and verifies its drafts with `accept_drafts` (the accepted drafts, the
counts and the generator rewind).

`Speculator` decides who drafts and how many: a request's cap (its `speculative_tokens`, else the engine's),
none while more than `speculative_max_num_seqs` requests run, and per request a number that grows while
drafts are accepted and shrinks when they are not; at low acceptance it pauses drafting, for longer each time.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from infer.engine.request import LiveRequest, Request, TokenLogprob
    from infer.engine.sampler import SamplerOutput

MAX_SPECULATIVE_TOKENS = 16  # drafts per request per step, at most
LOW_ACCEPTANCE = 0.3  # below this (a moving average of accepted / drafted), drafting pauses
MAX_PAUSE_STEPS = 64  # the longest pause; each pause in a row doubles, up to this
EMA_WEIGHT = 0.3  # weight of the newest step in the acceptance average


class DraftSource(Protocol):
    """Proposes the tokens that may follow a sequence (a request's prompt + output)."""

    def propose(self, token_ids: Sequence[int], max_tokens: int) -> list[int]:
        """Up to max_tokens guessed next tokens (none when it has no guess)."""
        ...


class NgramDraft:
    """Prompt lookup: the tokens after the latest earlier occurrence of the longest suffix n-gram (n from
    max_n down to min_n) within the last window_tokens tokens."""

    def __init__(self, min_n: int = 1, max_n: int = 4, window_tokens: int = 4096) -> None:
        assert 1 <= min_n <= max_n and window_tokens > max_n
        self.min_n, self.max_n, self.window_tokens = min_n, max_n, window_tokens

    def propose(self, token_ids: Sequence[int], max_tokens: int) -> list[int]:
        start = max(0, len(token_ids) - self.window_tokens)
        window = token_ids[start:]
        if max_tokens <= 0 or len(window) < 2:
            return []
        data = array("i", window).tobytes()  # NOTE: bytes.rfind is a C search; matches must be 4-aligned
        for n in range(min(self.max_n, len(window) - 1), self.min_n - 1, -1):
            # an earlier occurrence ends before the last token, so at least one token follows it
            end = _rfind_aligned(data, data[-4 * n :], len(data) - 4)
            if end >= 0:
                return list(window[end : end + max_tokens])
        return []


def _rfind_aligned(data: bytes, pattern: bytes, end_bytes: int) -> int:
    """The token index just past the latest 4-aligned occurrence of pattern within data[:end_bytes], or -1."""
    while True:
        pos = data.rfind(pattern, 0, end_bytes)
        if pos < 0:
            return -1
        if pos % 4 == 0:
            return (pos + len(pattern)) // 4
        end_bytes = pos + len(pattern) - 1


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


class Speculator:
    """Sets each running request's drafts before a step is scheduled."""

    def __init__(self, source: DraftSource, default_tokens: int, max_num_seqs: int, max_model_len: int) -> None:
        self.source, self.default_tokens = source, default_tokens
        self.max_num_seqs, self.max_model_len = max_num_seqs, max_model_len

    def max_drafts(self, r: Request) -> int:
        """A request's cap: its own setting, else the engine's; 0 (off) for a constrained request.
        NOTE: a grammar matcher would have to advance over drafts and roll back; not done yet."""
        if r.params.constraint is not None:
            return 0
        wanted = r.params.speculative_tokens
        return self.default_tokens if wanted is None else wanted

    def draft(self, running: Sequence[Request], states: Sequence[SpecState | None]) -> None:
        """Each running request's `draft_token_ids` for the next step (none while the batch is large)."""
        is_small = len(running) <= self.max_num_seqs
        for r, state in zip(running, states, strict=True):
            r.draft_token_ids = self._drafts(r, state) if is_small and state is not None else []

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
        return self.source.propose(r.all_token_ids, min(state.num_drafts, room))


def num_accepted(drafts: Sequence[int], sampled: Sequence[int]) -> int:
    """How many drafts were accepted: the longest prefix where draft j equals the token sampled at position j."""
    n = 0
    for draft, token in zip(drafts, sampled, strict=False):
        if draft != token:
            break
        n += 1
    return n


def rewind_generator(generator: torch.Generator, state: torch.Tensor, num_draws: int, vocab_size: int) -> None:
    """Set a request's generator to where plain decoding would have it: `state` (before the step) advanced by
    the noise of `num_draws` tokens (one vocab-sized draw each, as the sampler draws)."""
    import torch

    generator.set_state(state)
    noise = torch.empty(vocab_size, dtype=torch.float32, device=generator.device)
    for _ in range(num_draws):
        noise.exponential_(generator=generator)


def accept_drafts(
    spans: Sequence[tuple[LiveRequest, tuple[int, ...]]],
    out: SamplerOutput,
    states: dict[str, torch.Tensor],
    vocab_size: int,
) -> dict[str, list[tuple[int, TokenLogprob | None]]]:
    """Each request's new tokens from its rows of `out` (1 + its drafts each, in order): the accepted drafts
    and the token after them. Counts and adapts its drafting, and rewinds a seeded generator (`states`: its
    state before sampling) to the draws of the tokens it keeps."""
    result: dict[str, list[tuple[int, TokenLogprob | None]]] = {}
    first = 0
    for r, drafts in spans:
        ids, logprobs = out.token_ids[first : first + 1 + len(drafts)], out.logprobs[first : first + 1 + len(drafts)]
        first += 1 + len(drafts)
        n = num_accepted(drafts, ids)
        if drafts and r.spec is not None:
            r.num_draft_tokens, r.num_accepted_tokens = r.num_draft_tokens + len(drafts), r.num_accepted_tokens + n
            r.spec.record(len(drafts), n)
        state = states.get(r.request_id)
        if state is not None and r.generator is not None:
            rewind_generator(r.generator, state, n + 1, vocab_size)
        result[r.request_id] = list(zip(ids[: n + 1], logprobs[: n + 1], strict=True))
    return result
