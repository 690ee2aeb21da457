"""Verifying drafts: a step's sampling rows (each request, and each of its drafts) and the drafts accepted.

The scheduler runs a request's newest token and its drafts as one short chunk; the runner returns logits at
each of its positions; the runner's sampler samples every position as plain decoding would (the same
penalties, bans, noise; position j sees the drafts before it as output), and the drafts are accepted while
each equals what was sampled at its position. The sampled token that follows the accepted drafts (the
correction, or the bonus after all of them) is kept too, so each step emits 1 to k + 1 tokens, and the
scheduler rolls back the KV of the rejected drafts.

NOTE: for a sampled row, token j is argmax(p_j / E_j) with E_j ~ Exp(1) noise (the exponential race, as in
plain decoding). The draft d is accepted with probability p_j(d), and when it is not, the token drawn is
distributed as p_j with d removed, renormalised: the rejection rule for a deterministic proposal, so the
output distribution is the model's. A seeded request draws E_j from its own generator and rewinds it to the
draws it used (`rewind_generator`): the same tokens as without speculation.
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from infer.engine.sampler import SamplerOutput, SamplingBatch, SamplingRow
from infer.engine.stopping import banned_token_ids
from infer.engine.structured.manager import StructuredOutputs

if TYPE_CHECKING:
    from infer.engine.request import LiveRequest, TokenLogprob

Sampled = dict[str, list[tuple[int, "TokenLogprob | None"]]]  # each request's new tokens (and logprobs)
Span = tuple["LiveRequest", tuple[int, ...]]  # a request and its drafts: 1 + len(drafts) rows of logits


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
    generator.set_state(state)
    noise = torch.empty(vocab_size, dtype=torch.float32, device=generator.device)
    for _ in range(num_draws):
        noise.exponential_(generator=generator)


def accept_drafts(
    spans: Sequence[Span],
    out: SamplerOutput,
    states: dict[str, torch.Tensor],
    vocab_size: int,
) -> Sampled:
    """Each request's new tokens from its rows of `out` (1 + its drafts each, in order): the accepted drafts
    and the token after them. Counts and adapts its drafting, and rewinds a seeded generator (`states`: its
    state before sampling) to the draws of the tokens it keeps."""
    result: Sampled = {}
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


@dataclass(frozen=True)
class Verification:
    """A step's sampling as the verifier planned it: the requests with their drafts, the batch (1 + drafts rows
    each), and the generator state of each seeded request with drafts before the step."""

    spans: list[Span]
    batch: SamplingBatch
    states: dict[str, torch.Tensor]


class Verifier:
    """Plans a step's sampling and verifies its drafts: one sampling row per logits row (the constrained rows
    masked, stop tokens banned until min_tokens; position j of a request with drafts sees its first j drafts
    as output), run by the runner on the device; then each request's accepted drafts and the token after
    them (`accept_drafts`)."""

    def __init__(self, structured: StructuredOutputs, eos_token_ids: Set[int], vocab_size: int) -> None:
        self.structured, self.eos_token_ids, self.vocab_size = structured, eos_token_ids, vocab_size

    def plan(self, requests: Sequence[LiveRequest], drafts: dict[str, tuple[int, ...]]) -> Verification:
        spans = [(r, drafts.get(r.request_id, ())) for r in requests]
        # a seeded request with drafts: its generator is rewound to the draws of the tokens it keeps
        states = {r.request_id: r.generator.get_state() for r, d in spans if d and r.generator is not None}
        rows = [self._row(r, d[:j]) for r, d in spans for j in range(len(d) + 1)]
        mask = self.structured.bitmask([r for r, d in spans for _ in range(len(d) + 1)])
        return Verification(spans, SamplingBatch(rows, mask), states)

    def accept(self, plan: Verification, out: SamplerOutput) -> Sampled:
        """Each request's new tokens: one, or its accepted drafts and one more."""
        return accept_drafts(plan.spans, out, plan.states, self.vocab_size)

    def alone(self, plan: Verification, request: LiveRequest) -> Verification:
        """The plan of one of its requests, to sample again alone (its generator set back to before the step)."""
        state = plan.states.get(request.request_id)
        if state is not None and request.generator is not None:
            request.generator.set_state(state)
        return self.plan([request], {r.request_id: d for r, d in plan.spans if r is request and d})

    def _row(self, r: LiveRequest, drafts: Sequence[int] = ()) -> SamplingRow:
        banned = banned_token_ids(r, self.eos_token_ids, r.num_output_tokens + len(drafts))
        output = r.output_token_ids + list(drafts) if drafts else r.output_token_ids
        return SamplingRow(r.params, r.prompt_token_ids, output, r.generator, banned)
