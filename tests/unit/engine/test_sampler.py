"""Sampler: each filter and penalty on synthetic logits."""

from __future__ import annotations

from collections import Counter

import torch

from infer.engine.sampler import Sampler, SamplingRow
from infer.engine.sampling_params import SamplingParams

LOGITS = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0, -1.0]])


def row(prompt: tuple[int, ...] = (), output: tuple[int, ...] = (), **kw: object) -> SamplingRow:
    return SamplingRow(SamplingParams(**kw), prompt, output, None)  # type: ignore[arg-type]


def draws(params: dict[str, object], n: int = 400, logits: torch.Tensor = LOGITS) -> Counter[int]:
    sampler = Sampler(seed=0, device=torch.device("cpu"))
    batch = logits.expand(n, -1).clone()
    return Counter(sampler(batch, [row(**params)] * n).token_ids)  # type: ignore[arg-type]


def test_greedy_takes_the_argmax() -> None:
    out = Sampler(0, torch.device("cpu"))(LOGITS, [row(temperature=0.0)])
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
    out = Sampler(0, torch.device("cpu"))(LOGITS, [row(prompt=(0,), temperature=0.0, repetition_penalty=10.0)])
    assert out.token_ids == [1]  # 4 / 10 < 3


def test_frequency_and_presence_penalties_count_generated_tokens() -> None:
    sampler = Sampler(0, torch.device("cpu"))
    freq = sampler(LOGITS, [row(output=(0, 0), temperature=0.0, frequency_penalty=0.6)])
    assert freq.token_ids == [1]  # 4 - 2 * 0.6 = 2.8 < 3
    presence = sampler(LOGITS, [row(output=(0, 0), temperature=0.0, presence_penalty=0.6)])
    assert presence.token_ids == [0]  # 4 - 0.6 = 3.4 > 3


def test_banned_tokens_are_never_drawn() -> None:
    r = SamplingRow(SamplingParams(temperature=0.0), (), (), None, banned_token_ids=(0,))
    assert Sampler(0, torch.device("cpu"))(LOGITS, [r]).token_ids == [1]


def test_seeded_rows_repeat_whatever_the_neighbours() -> None:
    def seeded_draw(num_neighbours: int) -> int:
        g = torch.Generator().manual_seed(42)
        rows = [SamplingRow(SamplingParams(temperature=1.0), (), (), g)] + [row(temperature=1.0)] * num_neighbours
        logits = torch.randn(1 + num_neighbours, 50, generator=torch.Generator().manual_seed(1))
        logits[0] = torch.linspace(0, 1, 50)
        return Sampler(num_neighbours, torch.device("cpu"))(logits, rows).token_ids[0]

    assert seeded_draw(0) == seeded_draw(3) == seeded_draw(7)


def test_logprobs_top_n() -> None:
    out = Sampler(0, torch.device("cpu"))(LOGITS, [row(temperature=0.0, logprobs=3)])
    lp = out.logprobs[0]
    assert lp is not None
    assert [t for t, _ in lp.top] == [0, 1, 2]
    expected = torch.log_softmax(LOGITS[0], dim=-1)
    assert abs(lp.logprob - expected[0].item()) < 1e-6
