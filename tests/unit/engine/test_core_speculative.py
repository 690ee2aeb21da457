"""Speculative decoding in the step loop, on the fake runner: the same outputs as plain decoding (tokens, text,
stops, lengths, logprobs, seeds) whatever the drafts, the target distribution kept when sampling, and the KV
blocks of rejected drafts freed. The same on the default model is in test_core_speculative_default_model.py."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest
import torch

from infer.engine.core import EngineCore
from infer.engine.llm import LLM, CompletionOutput
from infer.engine.sampling_params import SamplingParams
from tests.helpers.fake_engine import TEXT, FakeRunner, fake_core

SETTINGS: dict[str, Any] = {"speculative_tokens": 4, "speculative_max_num_seqs": 64}


class TextDraft:
    """Drafts the fake model's own next tokens (all accepted under greedy), except from position `wrong_from`
    of each proposal on, where each draft is off by `shift` (rejected)."""

    def __init__(self, runner: FakeRunner, wrong_from: int | None = None, shift: int = 1) -> None:
        self.runner, self.wrong_from, self.shift = runner, wrong_from, shift
        self.num_calls = 0

    def propose(self, token_ids: Sequence[int], max_tokens: int) -> list[int]:
        self.num_calls += 1
        n = len(token_ids)
        drafts = [self.runner.token_at(n + i) for i in range(max_tokens)]
        if self.wrong_from is not None:
            drafts[self.wrong_from :] = [(t + self.shift) % self.runner.vocab_size for t in drafts[self.wrong_from :]]
        return drafts


DRAFTS = {"right": None, "wrong": 0, "half": 2}


def _engines(draft: str, **settings: Any) -> tuple[LLM, LLM, FakeRunner]:
    """A plain engine and one that speculates with the named drafts, on the same settings."""
    plain, _ = fake_core(**settings)
    core, runner = fake_core(**{**SETTINGS, **settings})
    core.speculator.proposer = TextDraft(runner, DRAFTS[draft])
    return LLM.from_core(plain), LLM.from_core(core), runner


def _ended_clean(*llms: LLM) -> None:
    for llm in llms:
        assert not llm.core.has_work
        llm.core.block_manager.assert_no_leaks()


def _same(a: list[CompletionOutput], b: list[CompletionOutput]) -> None:
    for x, y in zip(a, b, strict=True):
        assert (y.token_ids, y.text, y.finish_reason) == (x.token_ids, x.text, x.finish_reason)
        assert y.usage == x.usage and y.logprobs == x.logprobs


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, 300, (1 + (i * 29) % 70,), generator=g).tolist() for i in range(12)]


@pytest.mark.parametrize("draft", list(DRAFTS))
@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"max_num_batched_tokens": 16},
        {"batching": "static", "max_num_seqs": 4},
        {"num_blocks": 16},
        {"kv_reserve": "full", "max_model_len": 128},
    ],
    ids=["continuous", "chunk16", "static", "preempting", "full-reserve"],
)
def test_greedy_tokens_are_plain_greedy_whatever_the_drafts(draft: str, settings: dict[str, Any]) -> None:
    plain, spec, _ = _engines(draft, **settings)
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    _same(plain.generate(_prompts(), params), spec.generate(_prompts(), params))
    stats = spec.core.stats()
    assert stats.num_draft_tokens_total > 0
    if draft == "right":
        assert stats.num_accepted_tokens_total == stats.num_draft_tokens_total
        assert spec.core.num_steps < plain.core.num_steps  # several tokens a step
    if draft == "wrong":
        assert stats.num_accepted_tokens_total == 0
    if "num_blocks" in settings:
        assert stats.num_preemptions_total > 0
    _ended_clean(plain, spec)


@pytest.mark.parametrize("draft", list(DRAFTS))
def test_stops_lengths_logprobs_and_penalties_are_kept(draft: str) -> None:
    plain, spec, _ = _engines(draft)
    ids = plain.tokenizer.encode(TEXT)
    params = [
        SamplingParams(max_tokens=40, temperature=0, stop=["api"]),  # a stop string across two tokens
        SamplingParams(max_tokens=40, temperature=0, stop_token_ids=[ids[9]]),
        SamplingParams(max_tokens=40, temperature=0),  # eos at the text's end
        SamplingParams(max_tokens=7, temperature=0, ignore_eos=True),
        SamplingParams(max_tokens=30, temperature=0, min_tokens=25),  # eos banned past the text
        SamplingParams(max_tokens=12, temperature=0, logprobs=3, ignore_eos=True),
        SamplingParams(max_tokens=12, temperature=0, repetition_penalty=1.5, frequency_penalty=1.0),
    ]
    prompts = [ids[:3], ids[:3], ids[:-8], ids[:4], ids[:-6], ids[:2], ids[:5]]
    expected = plain.generate(prompts, params)
    _same(expected, spec.generate(prompts, params))
    assert spec.core.stats().num_draft_tokens_total > 0
    _ended_clean(plain, spec)


@pytest.mark.parametrize("draft", list(DRAFTS))
def test_seeded_sampling_gives_the_plain_tokens(draft: str) -> None:
    plain, spec, runner = _engines(draft)
    runner.logit_offset = 0.0
    seeded = [SamplingParams(max_tokens=20, temperature=0.7, seed=s, ignore_eos=True) for s in range(8)]
    prompts = [[5 + i, 6, 7] for i in range(8)]
    _same(plain.generate(prompts, seeded), spec.generate(prompts, seeded))
    assert spec.core.stats().num_accepted_tokens_total > 0 or draft == "wrong"
    _ended_clean(plain, spec)


def _histograms(llm: LLM, num_requests: int, vocab_size: int, temperature: float = 1.0) -> list[torch.Tensor]:
    """How often each token came out at output positions 1 and 2 (position 0 comes from the prefill)."""
    params = SamplingParams(max_tokens=3, temperature=temperature, ignore_eos=True)
    outputs = llm.generate([[5, 6, 7]] * num_requests, params)
    tokens = torch.tensor([o.token_ids for o in outputs])
    return [torch.bincount(tokens[:, i], minlength=vocab_size).double() for i in (1, 2)]


def _chi_square_p(a: torch.Tensor, b: torch.Tensor) -> float:
    """Two-sample chi-square test of equal distributions (equal totals), over the bins both saw 5 times or
    more (the rest pooled): the p-value."""
    keep = (a + b) >= 10
    a = torch.cat([a[keep], a[~keep].sum().reshape(1)])
    b = torch.cat([b[keep], b[~keep].sum().reshape(1)])
    seen = (a + b) > 0
    stat = ((a[seen] - b[seen]) ** 2 / (a[seen] + b[seen])).sum()
    df = int(seen.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2), stat / 2))


@pytest.mark.parametrize(("draft", "shift"), [("right", 1), ("wrong", 2), ("half", 1)])
def test_sampling_keeps_the_target_distribution(draft: str, shift: int) -> None:
    plain, spec, _ = _engines(draft, max_num_seqs=256, max_waiting_requests=4096)
    assert isinstance(spec.core.speculator.proposer, TextDraft)
    spec.core.speculator.proposer.shift = shift
    vocab = plain.core.model_info.vocab_size
    # the first token verified, and the next (after an accepted or a rejected draft)
    pairs = zip((1, 2), _histograms(plain, 2000, vocab), _histograms(spec, 2000, vocab), strict=True)
    for position, expected, got in pairs:
        assert _chi_square_p(expected, got) > 1e-3, f"position {position}"
    stats = spec.core.stats()
    assert stats.num_draft_tokens_total > 0
    if draft == "right":
        assert 0 < stats.num_accepted_tokens_total < stats.num_draft_tokens_total  # p(draft) < 1: some rejected
    _ended_clean(plain, spec)


def test_the_chi_square_check_sees_a_sharper_distribution() -> None:
    # what a rule that accepts drafts too often would do: the likely tokens more likely (here T = 0.8, not 1)
    plain, _, _ = _engines("right", max_num_seqs=256, max_waiting_requests=4096)
    vocab = plain.core.model_info.vocab_size
    sharper = _histograms(plain, 2000, vocab, temperature=0.8)[0]
    assert _chi_square_p(_histograms(plain, 2000, vocab)[0], sharper) < 1e-4
    _ended_clean(plain)


def _check_blocks(core: EngineCore) -> None:
    """Every running request holds the blocks of its computed tokens and no more; the pool counts them all."""
    bm, bs = core.block_manager, core.config.block_size
    held = 0
    for r in core.scheduler.running:
        assert len(bm.block_table(r.request_id)) == -(-r.num_computed_tokens // bs), r.request_id
        held += len(bm.block_table(r.request_id))
    assert bm.num_used_blocks == held


@pytest.mark.parametrize("draft", ["wrong", "half"])
def test_blocks_of_rejected_drafts_are_freed(draft: str) -> None:
    _, spec, _ = _engines(draft, enable_prefix_caching=False, block_size=4)
    core = spec.core
    outputs: list[CompletionOutput] = []
    for i, p in enumerate(_prompts()[:6]):
        out = CompletionOutput(p)
        outputs.append(out)
        core.add_request(f"r{i}", p, SamplingParams(max_tokens=30, temperature=0, ignore_eos=True), out.add)
    freed: list[int] = []
    truncate = core.block_manager.truncate

    def counting_truncate(request_id: str, num_tokens: int) -> None:
        before = core.block_manager.num_free_blocks
        truncate(request_id, num_tokens)
        freed.append(core.block_manager.num_free_blocks - before)

    core.block_manager.truncate = counting_truncate  # type: ignore[method-assign]
    while core.has_work:
        core.step()
        _check_blocks(core)
    assert sum(freed) > 0  # rejected drafts reached into new blocks, and those were freed
    assert all(len(o.token_ids) == 30 for o in outputs)
    _ended_clean(spec)


def test_per_request_opt_in_and_opt_out() -> None:
    _, spec, _ = _engines("right", speculative_tokens=0)
    greedy = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    off, on = spec.generate([[5, 6], [5, 6]], [greedy, replace(greedy, speculative_tokens=3)])
    assert off.timings is not None and on.timings is not None
    assert off.timings.num_draft_tokens == 0 and on.timings.num_draft_tokens > 0
    assert on.timings.acceptance_rate == 1.0 and on.token_ids == off.token_ids
    _, spec, _ = _engines("right")  # the engine's default is on: a request turns it off
    off = spec.generate([[5, 6]], replace(greedy, speculative_tokens=0))[0]
    assert off.timings is not None and off.timings.num_draft_tokens == 0
    _ended_clean(spec)


def test_no_drafts_while_the_batch_is_large() -> None:
    _, spec, _ = _engines("right", speculative_max_num_seqs=2)
    greedy = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    spec.generate([[5, 6]] * 3, greedy)
    assert spec.core.stats().num_draft_tokens_total == 0
    spec.generate([[5, 6]] * 2, greedy)
    assert spec.core.stats().num_draft_tokens_total > 0
    _ended_clean(spec)


def test_drafts_never_preempt() -> None:
    # a pool that just holds the requests: drafts that need a block nobody has are dropped, no one is preempted
    plain, spec, _ = _engines("right", num_blocks=16, max_model_len=64, block_size=16, enable_prefix_caching=False)
    greedy = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    prompts = [[5 + i] * 33 for i in range(4)]  # 33 + 30 tokens: 4 blocks each, 16 in all
    _same(plain.generate(prompts, greedy), spec.generate(prompts, greedy))
    assert spec.core.stats().num_preemptions_total == plain.core.stats().num_preemptions_total == 0
    _ended_clean(plain, spec)


def test_a_constrained_request_does_not_speculate_and_stays_valid() -> None:
    from infer.engine.structured import Constraint

    _, spec, _ = _engines("right")
    regex = Constraint.regex("[a-z ]{12}")
    free, constrained = spec.generate(
        [[5, 6], [5, 6]],
        [SamplingParams(max_tokens=12, temperature=0, ignore_eos=True),
         SamplingParams(max_tokens=40, temperature=0, constraint=regex, speculative_tokens=4)],
    )  # fmt: skip
    assert constrained.timings is not None and constrained.timings.num_draft_tokens == 0
    assert free.timings is not None and free.timings.num_draft_tokens > 0  # the batch beside it still speculates
    assert len(constrained.text) == 12 and set(constrained.text) <= set("abcdefghijklmnopqrstuvwxyz ")
    _ended_clean(spec)


def test_drafting_requests_and_a_constrained_one_sample_more_rows_than_max_num_seqs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """max_num_seqs 4, 4 drafts each: three drafting requests and a constrained one sample 16 rows in a step."""
    from infer.engine.structured import Constraint

    _, spec, _ = _engines("right", max_num_seqs=4, speculative_max_num_seqs=4)
    free = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    constrained = SamplingParams(max_tokens=40, temperature=0, constraint=Constraint.regex("[a-z ]{12}"))
    outs = spec.generate([[5, 6], [5, 7], [5, 8], [5, 9]], [free, free, free, constrained])
    assert all(o.timings is not None and o.timings.num_draft_tokens > 0 for o in outs[:3])
    assert len(outs[3].text) == 12 and set(outs[3].text) <= set("abcdefghijklmnopqrstuvwxyz ")
    assert "sampling failed" not in caplog.text  # one batch, not retried request by request
    _ended_clean(spec)
