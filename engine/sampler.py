"""Batched sampling on the device: grammar masks, penalties, temperature, top-k, top-p, min-p, seeds, logprobs;
and the `Verifier`, which samples a step's requests (each with its drafts) and verifies the drafts.

Greedy rows take the argmax (a step of only plain greedy rows takes nothing else: no copy of the
logits, no per-row passes). Sampled rows draw with the exponential-race trick
(argmax of probs / Exp(1) noise), so a request with a seed draws its noise
from its own generator and gets the same tokens whatever else is in the batch.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence, Set
from dataclasses import dataclass

import torch

from infer.engine.request import LiveRequest, TokenLogprob
from infer.engine.sampling_params import SamplingParams
from infer.engine.speculative import accept_drafts
from infer.engine.stopping import banned_token_ids
from infer.engine.structured.manager import StructuredOutputs, TokenBitmask, apply_bitmask

logger = logging.getLogger(__name__)

LOGPROB_FLOOR = -9999.0  # the logprob of a token that cannot be drawn (banned): finite, so JSON can carry it
ARGMAX_CHUNK = 2048  # logits a chunk in `argmax_rows`


def argmax_rows(logits: torch.Tensor) -> list[int]:
    """`logits.argmax(dim=-1).tolist()` (the first of equal maxima), faster on the CPU: torch's CPU argmax is a
    scalar loop (0.28 ms a row of Gemma 3's 262,144 logits, 6.3 ms for 16 rows on a core); a vectorised max of
    each chunk of ARGMAX_CHUNK, then the argmax of the chunks' maxima and of the first chunk that holds the
    row's maximum, take 0.06 and 0.74 ms. NOTE: rows without NaN (the sampler refuses those first)."""
    vocab = logits.shape[1]
    if logits.device.type != "cpu" or vocab < 2 * ARGMAX_CHUNK:
        ids: list[int] = logits.argmax(dim=-1).tolist()
        return ids
    whole = vocab // ARGMAX_CHUNK * ARGMAX_CHUNK
    maxima = logits[:, :whole].unfold(1, ARGMAX_CHUNK, ARGMAX_CHUNK).amax(dim=-1)  # [rows, chunks]
    if whole < vocab:
        maxima = torch.cat((maxima, logits[:, whole:].amax(dim=-1, keepdim=True)), dim=1)
    starts = [c * ARGMAX_CHUNK for c in maxima.argmax(dim=-1).tolist()]  # the first chunk with the row's maximum
    return [s + int(logits[r, s : s + ARGMAX_CHUNK].argmax()) for r, s in enumerate(starts)]


@dataclass(frozen=True)
class SamplingRow:
    """What the sampler needs of one request."""

    params: SamplingParams
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    generator: torch.Generator | None  # set for seeded requests
    banned_token_ids: Sequence[int] = ()  # eos and stop ids while min_tokens is not reached


@dataclass(frozen=True)
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[TokenLogprob | None]


def _apply_penalties(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> None:
    vocab = logits.shape[-1]
    for i, row in enumerate(rows):
        p = row.params
        if not p.has_penalties:
            continue
        if p.repetition_penalty != 1.0:
            seen = torch.tensor(list(row.prompt_token_ids) + list(row.output_token_ids), device=logits.device)
            seen = torch.unique(seen[seen < vocab])
            picked = logits[i, seen]
            rp = p.repetition_penalty
            logits[i, seen] = torch.where(picked > 0, picked / rp, picked * rp)
        if row.output_token_ids and (p.presence_penalty or p.frequency_penalty):
            out = torch.tensor(row.output_token_ids, device=logits.device)
            counts = torch.zeros(vocab, device=logits.device).index_add_(
                0, out, torch.ones_like(out, dtype=torch.float)
            )
            logits[i] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).float()


def _ban(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> None:
    """Eos and stop tokens while min_tokens is not reached; unless nothing would be left to draw."""
    for i, row in enumerate(rows):
        if row.banned_token_ids:
            kept = logits[i].clone()
            logits[i, list(row.banned_token_ids)] = float("-inf")
            if bool(torch.isneginf(logits[i]).all()):  # stop_token_ids cover the vocabulary
                logits[i] = kept


def _filter(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
    """Temperature, then top-k / top-p / min-p masks, on the rows that sample."""
    dev = logits.device
    temps = torch.tensor([r.params.temperature for r in rows], device=dev).unsqueeze(1)
    logits = logits / temps
    top_k = [r.params.top_k for r in rows]
    top_p = [r.params.top_p for r in rows]
    if any(k > 0 for k in top_k) or any(p < 1.0 for p in top_p):
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        rank = torch.arange(logits.shape[-1], device=dev).unsqueeze(0)
        k = torch.tensor([k if k > 0 else logits.shape[-1] for k in top_k], device=dev).unsqueeze(1)
        drop = rank >= k
        probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        drop |= mass_before >= torch.tensor(top_p, device=dev).unsqueeze(1)
        drop[:, 0] = False  # the most likely token always stays (a top_p that rounds to 0 in float32 too)
        logits = logits.scatter(1, order, sorted_logits.masked_fill(drop, float("-inf")))
    min_p = torch.tensor([r.params.min_p for r in rows], device=dev).unsqueeze(1)
    if bool((min_p > 0).any()):
        probs = logits.softmax(dim=-1)
        logits = logits.masked_fill(probs < min_p * probs.max(dim=-1, keepdim=True).values, float("-inf"))
    return logits


def _draw(logits: torch.Tensor, rows: Sequence[SamplingRow], generator: torch.Generator | None) -> torch.Tensor:
    probs = logits.softmax(dim=-1)
    noise = torch.empty_like(probs).exponential_(generator=generator)
    for i, row in enumerate(rows):
        if row.generator is not None:
            noise[i].exponential_(generator=row.generator)
    return (probs / noise).argmax(dim=-1)


def _logprobs(logprobs: torch.Tensor, token_ids: list[int], rows: Sequence[SamplingRow]) -> list[TokenLogprob | None]:
    out: list[TokenLogprob | None] = []
    for i, row in enumerate(rows):
        n = row.params.logprobs
        if n is None:
            out.append(None)
            continue
        top_values, top_ids = logprobs[i].topk(n) if n > 0 else (logprobs[i][:0], logprobs[i][:0].long())
        top = tuple(zip(top_ids.tolist(), top_values.tolist(), strict=True))
        out.append(TokenLogprob(token_ids[i], float(logprobs[i, token_ids[i]]), top))
    return out


def _finite(logits: torch.Tensor) -> bool:
    """No NaN or inf anywhere: one pass (a NaN makes both bounds NaN, an inf makes one of them inf)."""
    low, high = torch.aminmax(logits)
    return math.isfinite(float(low)) and math.isfinite(float(high))


def _plain_greedy(row: SamplingRow) -> bool:
    """A row whose token is the argmax of its logits as they are: greedy, no penalties, bans or logprobs."""
    p = row.params
    return p.is_greedy and not p.has_penalties and not row.banned_token_ids and p.logprobs is None


class Sampler:
    def __init__(self, seed: int, device: torch.device) -> None:
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)

    def __call__(
        self, logits: torch.Tensor, rows: Sequence[SamplingRow], mask: TokenBitmask | None = None
    ) -> SamplerOutput:
        """logits: [num_rows, vocab] fp32, one row per request that samples this step; `mask`: the tokens
        the constrained rows' grammars allow (applied first, so every later step sees only those)."""
        assert logits.shape[0] == len(rows)
        if logits.numel() and not _finite(logits):
            raise FloatingPointError("the model's logits are not finite (NaN or inf)")
        if mask is None and all(_plain_greedy(r) for r in rows):
            return SamplerOutput(argmax_rows(logits), [None] * len(rows))
        logits = logits.clone()
        if mask is not None:
            apply_bitmask(logits, mask)
        _apply_penalties(logits, rows)
        _ban(logits, rows)
        token_ids = torch.tensor(argmax_rows(logits), dtype=torch.long, device=logits.device)
        sampled = [i for i, r in enumerate(rows) if not r.params.is_greedy]
        if sampled:
            sub_rows = [rows[i] for i in sampled]
            idx = torch.tensor(sampled, device=logits.device)
            token_ids[idx] = _draw(_filter(logits[idx], sub_rows), sub_rows, self.generator)
        ids = token_ids.tolist()
        if all(r.params.logprobs is None for r in rows):
            return SamplerOutput(ids, [None] * len(rows))
        return SamplerOutput(ids, _logprobs(logits.log_softmax(dim=-1).clamp(min=LOGPROB_FLOOR), ids, rows))


Sampled = dict[str, list[tuple[int, TokenLogprob | None]]]  # each request's new tokens (and logprobs)
Span = tuple[LiveRequest, tuple[int, ...]]  # a request and its drafts: 1 + len(drafts) rows of logits


class Verifier:
    """Samples a step's rows and verifies its drafts: the sampler over every row (the constrained rows masked,
    stop tokens banned until min_tokens), then each request's accepted drafts and the token after them."""

    def __init__(self, sampler: Sampler, structured: StructuredOutputs, eos_token_ids: Set[int]) -> None:
        self.sampler, self.structured, self.eos_token_ids = sampler, structured, eos_token_ids

    def __call__(
        self, logits: torch.Tensor, requests: Sequence[LiveRequest], drafts: dict[str, tuple[int, ...]]
    ) -> tuple[Sampled, list[tuple[str, Exception]]]:
        """Each request's new tokens: one, or its accepted drafts and one more (rows: 1 + its drafts each);
        and the requests that failed (tried one by one after the batch failed)."""
        spans = [(r, drafts.get(r.request_id, ())) for r in requests]
        # a seeded request with drafts: its generator is rewound to the draws of the tokens it keeps
        states = {r.request_id: r.generator.get_state() for r, d in spans if d and r.generator is not None}
        try:
            return accept_drafts(spans, self._sample(logits, spans), states, logits.shape[-1]), []
        except Exception:
            logger.exception("sampling failed; retrying its requests one by one")
        return self._one_by_one(logits, spans, states)

    def _one_by_one(
        self, logits: torch.Tensor, spans: list[Span], states: dict[str, torch.Tensor]
    ) -> tuple[Sampled, list[tuple[str, Exception]]]:
        result: Sampled = {}
        failed: list[tuple[str, Exception]] = []
        first = 0
        for r, d in spans:
            rows = logits[first : first + 1 + len(d)]
            first += 1 + len(d)
            try:
                if r.request_id in states and r.generator is not None:
                    r.generator.set_state(states[r.request_id])
                result |= accept_drafts([(r, d)], self._sample(rows, [(r, d)]), states, logits.shape[-1])
            except Exception as e:
                failed.append((r.request_id, e))
        return result, failed

    def _sample(self, logits: torch.Tensor, spans: list[Span]) -> SamplerOutput:
        """Sample every row: position j of a request with drafts sees its first j drafts as output."""
        rows = [self._row(r, d[:j]) for r, d in spans for j in range(len(d) + 1)]
        mask = self.structured.bitmask([r for r, d in spans for _ in range(len(d) + 1)])
        return self.sampler(logits[: len(rows)], rows, mask)

    def _row(self, r: LiveRequest, drafts: Sequence[int] = ()) -> SamplingRow:
        banned = banned_token_ids(r, self.eos_token_ids, r.num_output_tokens + len(drafts))
        output = r.output_token_ids + list(drafts) if drafts else r.output_token_ids
        return SamplingRow(r.params, r.prompt_token_ids, output, r.generator, banned)
