"""Batched sampling on the device: grammar masks, penalties, temperature, top-k, top-p, min-p, seeds, logprobs.

The runner samples (`ModelRunner.step`): the core gets token ids and logprobs, never logits, and a step
copies them to the host once (`to_host`). A step's rows are planned by the speculation package's `Verifier`
(one row per request, and one per draft).

Greedy rows take the argmax (a step of only plain greedy rows takes nothing else: no copy of the
logits, no per-row passes). Sampled rows draw with the exponential-race trick
(argmax of probs / Exp(1) noise), so a request with a seed draws its noise
from its own generator and gets the same tokens whatever else is in the batch.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from infer.engine.request import TokenLogprob
from infer.engine.sampling_params import SamplingParams
from infer.engine.step_inputs import StepInputs
from infer.engine.structured.manager import TokenBitmask, apply_bitmask

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
class SamplingBatch:
    """A step's sampling: one row per logits row, and the constrained rows' allowed tokens."""

    rows: Sequence[SamplingRow]
    mask: TokenBitmask | None = None

    @property
    def is_plain_greedy(self) -> bool:
        """Every row takes the argmax of its logits as they are: nothing to copy, mask or draw."""
        return self.mask is None and all(_plain_greedy(r) for r in self.rows)

    @functools.cached_property
    def drawn(self) -> list[int]:
        """The rows that draw (not greedy)."""
        return [i for i, r in enumerate(self.rows) if not r.params.is_greedy]

    def drawn_columns(self) -> dict[str, list[int] | list[float]]:
        """The drawing rows and their parameters, by `SamplingTensors` field (and `StepInputs` region)."""
        params = [self.rows[i].params for i in self.drawn]
        return {
            "drawn": self.drawn,
            "temperature": [p.temperature for p in params],
            "top_k": [p.top_k for p in params],
            "top_p": [p.top_p for p in params],
            "min_p": [p.min_p for p in params],
        }


@dataclass(frozen=True)
class SamplingTensors:
    """The drawing rows and their parameters on the device, in `SamplingBatch.drawn` order (views of the step's
    inputs: sent with them in one copy)."""

    drawn: torch.Tensor  # [num_drawn] int64
    temperature: torch.Tensor  # [num_drawn] fp32
    top_k: torch.Tensor  # [num_drawn] int64 (0: off)
    top_p: torch.Tensor  # [num_drawn] fp32
    min_p: torch.Tensor  # [num_drawn] fp32

    @classmethod
    def of(cls, batch: SamplingBatch, device: torch.device) -> SamplingTensors:
        """Made for this batch alone (a caller without the step's inputs: tests)."""
        columns = batch.drawn_columns()
        return cls(**{name: torch.tensor(values, dtype=_DTYPES[name], device=device)
                      for name, values in columns.items()})  # fmt: skip


_DTYPES = {"drawn": torch.int64, "temperature": torch.float32, "top_k": torch.int64, "top_p": torch.float32,
           "min_p": torch.float32}  # fmt: skip


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
            seen_ids = [t for t in (*row.prompt_token_ids, *row.output_token_ids) if 0 <= t < vocab]
            seen = torch.zeros(vocab, dtype=torch.bool, device=logits.device)
            seen[torch.tensor(seen_ids, dtype=torch.int64, device=logits.device)] = True
            rp = p.repetition_penalty
            penalised = torch.where(logits[i] > 0, logits[i] / rp, logits[i] * rp)
            logits[i] = torch.where(seen, penalised, logits[i])
        if row.output_token_ids and (p.presence_penalty or p.frequency_penalty):
            out = torch.tensor(row.output_token_ids, device=logits.device)
            counts = torch.zeros(vocab, device=logits.device).index_add_(
                0, out, torch.ones_like(out, dtype=torch.float)
            )
            logits[i] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).float()


def _ban(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> None:
    """Eos and stop tokens while min_tokens is not reached; unless nothing would be left to draw (decided on the
    device: no wait for it)."""
    for i, row in enumerate(rows):
        if row.banned_token_ids:
            banned = logits[i].index_fill(
                0, torch.tensor(row.banned_token_ids, dtype=torch.int64, device=logits.device), float("-inf")
            )
            # stop_token_ids that cover the vocabulary ban nothing
            logits[i] = torch.where(torch.isneginf(banned).all(), logits[i], banned)


def _filter(logits: torch.Tensor, rows: Sequence[SamplingRow], t: SamplingTensors) -> torch.Tensor:
    """Temperature, then top-k / top-p / min-p masks, on the rows that draw (`t`: their parameters)."""
    dev = logits.device
    logits = logits / t.temperature.unsqueeze(1)
    if any(r.params.top_k > 0 or r.params.top_p < 1.0 for r in rows):
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        rank = torch.arange(logits.shape[-1], device=dev).unsqueeze(0)
        k = torch.where(t.top_k > 0, t.top_k, logits.shape[-1]).unsqueeze(1)
        drop = rank >= k
        probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        drop |= mass_before >= t.top_p.unsqueeze(1)
        drop[:, 0] = False  # the most likely token always stays (a top_p that rounds to 0 in float32 too)
        logits = logits.scatter(1, order, sorted_logits.masked_fill(drop, float("-inf")))
    if any(r.params.min_p > 0 for r in rows):
        probs = logits.softmax(dim=-1)
        min_p = t.min_p.unsqueeze(1)
        logits = logits.masked_fill(probs < min_p * probs.max(dim=-1, keepdim=True).values, float("-inf"))
    return logits


def _draw(logits: torch.Tensor, rows: Sequence[SamplingRow], generator: torch.Generator | None) -> torch.Tensor:
    probs = logits.softmax(dim=-1)
    noise = torch.empty_like(probs).exponential_(generator=generator)
    for i, row in enumerate(rows):
        if row.generator is not None:
            noise[i].exponential_(generator=row.generator)
    return (probs / noise).argmax(dim=-1)


def _logprob_tensors(
    logits: torch.Tensor, token_ids: torch.Tensor, rows: Sequence[SamplingRow]
) -> list[torch.Tensor]:  # chosen [n], top values [n, k], top ids [n, k] with k the most any row asks for
    logprobs = logits.log_softmax(dim=-1).clamp(min=LOGPROB_FLOOR)
    chosen = logprobs.gather(1, token_ids.unsqueeze(1)).squeeze(1)
    k = max(r.params.logprobs or 0 for r in rows)
    top_values, top_ids = logprobs.topk(k, dim=-1) if k > 0 else (logprobs[:, :0], logprobs[:, :0].long())
    return [chosen, top_values, top_ids]


def _unpack_logprobs(
    token_ids: list[int], values: list[float], rows: Sequence[SamplingRow]
) -> list[TokenLogprob | None]:
    """Each row's TokenLogprob from the flat copy [chosen (n), top values (n * k), top ids (n * k)]."""
    n = len(rows)
    k = max(r.params.logprobs or 0 for r in rows)
    out: list[TokenLogprob | None] = []
    for i, row in enumerate(rows):
        want = row.params.logprobs
        if want is None:
            out.append(None)
            continue
        first = n + i * k
        top_values = values[first : first + want]
        top_ids = values[n + n * k + i * k : n + n * k + i * k + want]
        top = tuple((int(t), v) for t, v in zip(top_ids, top_values, strict=True))
        out.append(TokenLogprob(token_ids[i], values[i], top))
    return out


def _finite(logits: torch.Tensor) -> bool:
    """No NaN or inf anywhere: one pass (a NaN makes both bounds NaN, an inf makes one of them inf)."""
    low, high = torch.aminmax(logits)
    return math.isfinite(float(low)) and math.isfinite(float(high))


def _finite_flag(logits: torch.Tensor) -> torch.Tensor:  # [1] fp64: 1 when no NaN or inf, on the device
    return torch.isfinite(torch.stack(torch.aminmax(logits))).all().double().reshape(1)


def _plain_greedy(row: SamplingRow) -> bool:
    """A row whose token is the argmax of its logits as they are: greedy, no penalties, bans or logprobs."""
    p = row.params
    return p.is_greedy and not p.has_penalties and not row.banned_token_ids and p.logprobs is None


def to_host(parts: Sequence[torch.Tensor]) -> list[float]:
    """The step's one device-to-host copy: the parts flattened, as float64 (exact for ids and fp32 values)."""
    flat = torch.cat([p.reshape(-1).double() for p in parts])
    values: list[float] = flat.tolist()
    return values


class Sampler:
    """Samples a step's logits where they are (the model's device): one copy to the host a step carries the
    token ids, whether the logits were finite, and the logprobs asked for. On the CPU (no copy to save) a step
    of plain greedy rows takes the vectorised `argmax_rows` instead."""

    def __init__(self, seed: int, device: torch.device) -> None:
        self.device = device
        self.on_host = device.type == "cpu"  # the argmax and the finite check read the logits where they are
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)

    def write_inputs(self, batch: SamplingBatch, inputs: StepInputs) -> SamplingTensors:
        """The drawing rows' parameters into the step's inputs (sent with them); their device views."""
        k = len(batch.drawn)
        for name, values in batch.drawn_columns().items():
            inputs.host(name)[:k] = values
        return SamplingTensors(**{name: inputs.view(name)[:k] for name in _DTYPES})

    def __call__(
        self, logits: torch.Tensor, batch: SamplingBatch, tensors: SamplingTensors | None = None
    ) -> SamplerOutput:
        """logits: [num_rows, vocab] fp32, one row per row of `batch`; the mask (the constrained rows' allowed
        tokens) applies first, so every later step sees only those. `tensors`: the drawing rows' parameters
        already on the device (`write_inputs`), else made here."""
        rows = batch.rows
        assert logits.shape[0] == len(rows)
        if not rows:
            return SamplerOutput([], [])
        if batch.is_plain_greedy:
            if self.on_host:
                if not _finite(logits):
                    raise _not_finite()
                return SamplerOutput(argmax_rows(logits), [None] * len(rows))
            flat = to_host([logits.argmax(dim=-1), _finite_flag(logits)])
            return SamplerOutput(self._ids(flat, len(rows)), [None] * len(rows))
        finite = _finite_flag(logits)
        logits = logits.clone()
        if batch.mask is not None:
            apply_bitmask(logits, batch.mask)
        _apply_penalties(logits, rows)
        _ban(logits, rows)
        token_ids = torch.tensor(argmax_rows(logits), dtype=torch.int64) if self.on_host else logits.argmax(dim=-1)
        drawn = batch.drawn
        if drawn:
            t = tensors if tensors is not None else SamplingTensors.of(batch, logits.device)
            sub_rows = [rows[i] for i in drawn]
            token_ids[t.drawn] = _draw(_filter(logits[t.drawn], sub_rows, t), sub_rows, self.generator)
        parts = [token_ids, finite]
        wants_logprobs = any(r.params.logprobs is not None for r in rows)
        if wants_logprobs:
            parts += _logprob_tensors(logits, token_ids, rows)
        flat = to_host(parts)
        ids = self._ids(flat, len(rows))
        if not wants_logprobs:
            return SamplerOutput(ids, [None] * len(rows))
        return SamplerOutput(ids, _unpack_logprobs(ids, flat[len(rows) + 1 :], rows))

    @staticmethod
    def _ids(flat: list[float], n: int) -> list[int]:
        if flat[n] != 1.0:
            raise _not_finite()
        return [int(t) for t in flat[:n]]


def _not_finite() -> FloatingPointError:
    return FloatingPointError("the model's logits are not finite (NaN or inf)")
