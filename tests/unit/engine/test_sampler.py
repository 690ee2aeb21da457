"""Sampler: each filter and penalty on synthetic logits."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from infer.engine import sampler as sampler_module
from infer.engine.sampler import (
    LOGPROB_FLOOR,
    Sampler,
    SamplerOutput,
    SamplingBatch,
    SamplingRow,
    SamplingTensors,
    argmax_rows,
)
from infer.engine.sampling_params import MIN_REPETITION_PENALTY, MIN_TEMPERATURE, SamplingParams
from infer.engine.structured.manager import TokenBitmask
from tests.helpers.dispatch import Allocations

LOGITS = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0, -1.0]])


def sample(
    sampler: Sampler, logits: torch.Tensor, rows: list[SamplingRow], mask: TokenBitmask | None = None
) -> SamplerOutput:
    return sampler(logits, SamplingBatch(rows, mask))


def row(prompt: tuple[int, ...] = (), output: tuple[int, ...] = (), **kw: object) -> SamplingRow:
    return SamplingRow(SamplingParams(**kw), prompt, output, None)  # type: ignore[arg-type]


def draws(params: dict[str, object], n: int = 400, logits: torch.Tensor = LOGITS) -> Counter[int]:
    sampler = Sampler(seed=0, device=torch.device("cpu"))
    batch = logits.expand(n, -1).clone()
    return Counter(sample(sampler, batch, [row(**params)] * n).token_ids)  # type: ignore[arg-type]


def test_greedy_takes_the_argmax() -> None:
    out = sample(Sampler(0, torch.device("cpu")), LOGITS, [row(temperature=0.0)])
    assert out.token_ids == [0]


def test_top_k_keeps_only_k_tokens() -> None:
    assert set(draws({"temperature": 5.0, "top_k": 2})) == {0, 1}


def test_top_p_keeps_the_smallest_set_over_p() -> None:
    # probabilities ~ .64 .23 .09 ...: top_p 0.8 keeps tokens 0 and 1
    assert set(draws({"temperature": 1.0, "top_p": 0.8})) == {0, 1}


def test_min_p_drops_unlikely_tokens() -> None:
    # p(1) / p(0) = e^-1 ≈ .37 stays; p(2) / p(0) ≈ .14 goes
    assert set(draws({"temperature": 1.0, "min_p": 0.2})) == {0, 1}


def test_high_temperature_spreads_the_draws() -> None:
    assert len(draws({"temperature": 50.0})) == 6


def test_repetition_penalty_demotes_seen_tokens() -> None:
    out = sample(Sampler(0, torch.device("cpu")), LOGITS, [row(prompt=(0,), temperature=0.0, repetition_penalty=10.0)])
    assert out.token_ids == [1]  # 4 / 10 < 3


def test_frequency_and_presence_penalties_count_generated_tokens() -> None:
    sampler = Sampler(0, torch.device("cpu"))
    freq = sample(sampler, LOGITS, [row(output=(0, 0), temperature=0.0, frequency_penalty=0.6)])
    assert freq.token_ids == [1]  # 4 - 2 * 0.6 = 2.8 < 3
    presence = sample(sampler, LOGITS, [row(output=(0, 0), temperature=0.0, presence_penalty=0.6)])
    assert presence.token_ids == [0]  # 4 - 0.6 = 3.4 > 3


def test_banned_tokens_are_never_drawn() -> None:
    r = SamplingRow(SamplingParams(temperature=0.0), (), (), None, banned_token_ids=(0,))
    assert sample(Sampler(0, torch.device("cpu")), LOGITS, [r]).token_ids == [1]


def test_seeded_rows_repeat_whatever_the_neighbours() -> None:
    def seeded_draw(num_neighbours: int) -> int:
        g = torch.Generator().manual_seed(42)
        rows = [SamplingRow(SamplingParams(temperature=1.0), (), (), g)] + [row(temperature=1.0)] * num_neighbours
        logits = torch.randn(1 + num_neighbours, 50, generator=torch.Generator().manual_seed(1))
        logits[0] = torch.linspace(0, 1, 50)
        return sample(Sampler(num_neighbours, torch.device("cpu")), logits, rows).token_ids[0]

    assert seeded_draw(0) == seeded_draw(3) == seeded_draw(7)


def test_logprobs_top_n() -> None:
    out = sample(Sampler(0, torch.device("cpu")), LOGITS, [row(temperature=0.0, logprobs=3)])
    lp = out.logprobs[0]
    assert lp is not None
    assert [t for t, _ in lp.top] == [0, 1, 2]
    expected = torch.log_softmax(LOGITS[0], dim=-1)
    assert abs(lp.logprob - expected[0].item()) < 1e-6


# argmax at 2, so a draw that falls back to token 0 (what NaN probabilities give) shows
PEAKED = torch.tensor([[1.0, 3.0, 4.0, 2.0, 0.0, -1.0]])


def _finite(out: SamplerOutput) -> bool:
    values = [v for lp in out.logprobs if lp for v in (lp.logprob, *(t[1] for t in lp.top))]
    return all(math.isfinite(v) for v in values)


def test_a_tiny_temperature_is_raised_to_its_minimum_and_samples_near_greedily() -> None:
    assert SamplingParams(temperature=1e-300).temperature == MIN_TEMPERATURE
    assert SamplingParams(temperature=0.0).is_greedy  # 0 stays greedy
    assert set(draws({"temperature": 1e-300}, n=50, logits=PEAKED)) == {2}  # was token 0 every time


def test_a_tiny_repetition_penalty_gives_finite_logprobs() -> None:
    assert SamplingParams(repetition_penalty=1e-300).repetition_penalty == MIN_REPETITION_PENALTY
    sampler = Sampler(0, torch.device("cpu"))
    for temperature in (0.0, 1.0):
        out = sample(
            sampler, PEAKED, [row(prompt=(1, 2), temperature=temperature, repetition_penalty=1e-300, logprobs=3)]
        )
        assert _finite(out)  # was NaN
    greedy = sample(sampler, PEAKED, [row(prompt=(1, 2), temperature=0.0, repetition_penalty=1e-300)])
    assert greedy.token_ids == [2]  # 4 / 0.01 is still the largest logit


def test_a_top_p_that_rounds_to_zero_keeps_the_most_likely_token() -> None:
    assert set(draws({"temperature": 1.0, "top_p": 1e-300}, n=50, logits=PEAKED)) == {2}


def test_when_every_token_is_banned_the_ban_is_lifted_rather_than_drawing_nan() -> None:
    sampler = Sampler(0, torch.device("cpu"))
    every = tuple(range(PEAKED.shape[1]))
    out = sample(sampler, PEAKED, [SamplingRow(SamplingParams(temperature=1.0, logprobs=2), (), (), None, every)])
    assert out.token_ids[0] in every and _finite(out)


def test_a_banned_token_has_the_floor_logprob_not_minus_infinity() -> None:
    banned = SamplingRow(SamplingParams(temperature=0.0, logprobs=6), (), (), None, (0, 1, 2, 3))
    out = sample(Sampler(0, torch.device("cpu")), PEAKED, [banned])
    lp = out.logprobs[0]
    assert out.token_ids == [4] and lp is not None
    assert sorted(v for _, v in lp.top)[:4] == [LOGPROB_FLOOR] * 4


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_logits_that_are_not_finite_are_refused(bad: float, temperature: float) -> None:
    logits = torch.zeros(3, 1000)
    logits[1, 617] = bad  # one value in the middle row
    with pytest.raises(FloatingPointError, match="not finite"):
        sample(Sampler(0, torch.device("cpu")), logits, [row(temperature=temperature)] * 3)


def test_plain_greedy_rows_take_the_argmax_beside_rows_that_need_more() -> None:
    logits = torch.tensor([[0.0, 5.0, 1.0, 2.0], [3.0, 1.0, 0.0, 2.5], [1.0, 0.0, 4.0, 3.9]])
    kept = logits.clone()
    sampler = Sampler(0, torch.device("cpu"))
    assert sample(sampler, logits, [row(temperature=0.0)] * 3).token_ids == [1, 0, 2]  # all plain greedy
    # beside a banned token, a penalty and logprobs, each row gets what it asked for
    banned = SamplingRow(SamplingParams(temperature=0.0), (), (), None, (0,))
    rows = [row(temperature=0.0), banned, row((2,), temperature=0.0, repetition_penalty=2.0, logprobs=1)]
    out = sample(sampler, logits, rows)
    assert out.token_ids == [1, 3, 3] and out.logprobs[:2] == [None, None] and out.logprobs[2] is not None
    assert torch.equal(logits, kept)  # the caller's logits are never changed


def _mask(allowed: dict[int, list[int]], num_rows: int, vocab: int) -> TokenBitmask:
    """Rows in `allowed` may take only those tokens; the other rows are unconstrained."""
    bits = torch.zeros(num_rows, (vocab + 31) // 32, dtype=torch.int32)
    for r, tokens in allowed.items():
        for t in tokens:
            bits[r, t // 32] |= 1 << (t % 32)
    return TokenBitmask(bits, sorted(allowed))


def test_a_grammar_mask_applies_before_temperature_and_top_k() -> None:
    sampler = Sampler(0, torch.device("cpu"))
    rows = [row(temperature=1.0, top_k=1), row(temperature=0.0)]
    # top_k=1 before the mask would keep only token 0, which the grammar forbids: nothing would be left
    out = sample(sampler, LOGITS.expand(2, -1).clone(), rows, _mask({0: [2, 4]}, 2, 6))
    assert out.token_ids == [2, 0]  # the best allowed token; the unconstrained row is untouched


def test_sampling_never_draws_a_token_the_grammar_forbids() -> None:
    n = 400
    sampler = Sampler(0, torch.device("cpu"))
    batch = LOGITS.expand(n, -1).clone()
    mask = _mask({i: [1, 3, 5] for i in range(0, n, 2)}, n, 6)
    out = sample(sampler, batch, [row(temperature=5.0, logprobs=1)] * n, mask)
    constrained = Counter(out.token_ids[0::2])
    assert set(constrained) == {1, 3, 5}
    assert len(set(out.token_ids[1::2])) == 6  # unconstrained rows still spread over the vocabulary
    one = sample(sampler, LOGITS, [row(temperature=1.0, logprobs=5)], _mask({0: [1, 3, 5]}, 1, 6)).logprobs[0]
    assert one is not None and [t for t, _ in one.top[:3]] == [1, 3, 5]  # logprobs of the masked distribution
    assert sum(math.exp(v) for _, v in one.top[:3]) == pytest.approx(1.0)
    assert [v for _, v in one.top[3:]] == [LOGPROB_FLOOR] * 2


@pytest.mark.parametrize("vocab", [4096, 5000, 49152, 151936, 262144])
def test_argmax_rows_is_torchs_argmax_first_of_equal_maxima_included(vocab: int) -> None:
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(7, vocab, generator=gen)
    logits[0, vocab - 1] = 50.0  # in the tail past the last whole chunk (when there is one)
    logits[1, [3, 2047, 2048, vocab - 1]] = 50.0  # equal maxima in several chunks: the first wins
    logits[2, [2049, 2050]] = 50.0  # equal maxima in one chunk
    logits[3] = float("-inf")  # every token banned: index 0, as torch
    logits[4, 100:] = float("-inf")
    logits[5] = 0.0
    logits[6, [4095, 4094]] = 50.0
    assert argmax_rows(logits) == logits.argmax(dim=-1).tolist()
    assert argmax_rows(logits[2:3]) == [2049]


def test_a_step_on_a_device_copies_to_the_host_once_and_waits_for_nothing_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Greedy, drawn, penalised, banned, masked and logprob rows in one step: the sampler makes no tensor from
    host data beyond the step's inputs and its one copy back (`to_host`) is the only wait for the device."""
    copies: list[int] = []
    to_host = sampler_module.to_host

    def counted(parts: list[torch.Tensor]) -> list[float]:
        copies.append(len(parts))
        return to_host(parts)

    monkeypatch.setattr(sampler_module, "to_host", counted)
    sampler = Sampler(0, torch.device("cpu"))
    sampler.on_host = False  # the path a GPU takes: no argmax read on the host
    rows = [
        row(temperature=0.0),
        row(temperature=0.8, top_k=3, top_p=0.9, min_p=0.05, logprobs=2),
        row(prompt=(0,), output=(1, 1), temperature=0.0, repetition_penalty=1.3, frequency_penalty=0.5),
        SamplingRow(SamplingParams(temperature=1.0), (), (), None, (0, 1)),
    ]
    batch = SamplingBatch(rows, _mask({1: [0, 2, 4]}, 4, 6))
    logits = LOGITS.expand(4, -1).clone()
    tensors = SamplingTensors.of(batch, logits.device)  # the step's inputs, sent before the forward pass
    with Allocations() as counted_ops:
        out = sampler(logits, batch, tensors)
    assert copies == [5] and counted_ops.waited == [], counted_ops.waited
    assert out.token_ids[0] == 0 and out.token_ids[1] in (0, 2, 4) and out.token_ids[3] not in (0, 1)
    assert out.logprobs[1] is not None and out.logprobs[0] is None
    copies.clear()
    assert sampler(logits, SamplingBatch([row(temperature=0.0)] * 4)).token_ids == [0] * 4
    assert copies == [2]  # plain greedy: the argmax and the finite flag


def test_not_finite_logits_are_refused_on_a_device_too() -> None:
    sampler = Sampler(0, torch.device("cpu"))
    sampler.on_host = False
    logits = LOGITS.clone()
    logits[0, 3] = float("nan")
    for params in ({"temperature": 0.0}, {"temperature": 1.0, "logprobs": 1}):
        with pytest.raises(FloatingPointError, match="not finite"):
            sampler(logits, SamplingBatch([row(**params)]))
