"""The engine on the default model: batching never changes greedy tokens, whatever the settings."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from infer import LLM, SamplingParams
from infer.engine.core import QueueFullError
from infer.engine.request import FinishReason

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
WORDS = "the quick brown fox jumps over a lazy dog while seven wizards hum old songs".split()  # noqa: SIM905


def _prompts() -> list[list[int]]:
    """16 prompts of mixed lengths (3 to 93 tokens), as token ids."""
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(16):
        n = 3 + (i * 37) % 91
        out.append(torch.randint(100, 40000, (n,), generator=g).tolist())
    return out


@pytest.fixture(scope="module")
def alone(default_model_dir: Path) -> list[list[int]]:
    """Each prompt's greedy tokens when it runs alone."""
    llm = LLM(str(default_model_dir), max_model_len=256)
    tokens = [llm.generate([p], GREEDY)[0].token_ids for p in _prompts()]
    llm.core.block_manager.assert_no_leaks()
    return tokens


def _engine(model_dir: Path, **settings: Any) -> Iterator[LLM]:
    llm = LLM(str(model_dir), **{"max_model_len": 256, **settings})
    yield llm
    llm.core.block_manager.assert_no_leaks()  # every test ends with every block free


@pytest.fixture
def engine(request: pytest.FixtureRequest, default_model_dir: Path) -> Iterator[LLM]:
    yield from _engine(default_model_dir, **getattr(request, "param", {}))


@pytest.mark.parametrize(
    "engine",
    [
        {},
        {"max_num_batched_tokens": 16},  # chunked prefill: every long prompt takes several steps
        {"batching": "static", "max_num_seqs": 8},
        {"kv_reserve": "full"},
        {"enable_prefix_caching": False},
    ],
    indirect=True,
    ids=["continuous", "chunk16", "static", "full-reserve", "no-prefix-cache"],
)
def test_batched_greedy_equals_alone(engine: LLM, alone: list[list[int]]) -> None:
    outputs = engine.generate(_prompts(), GREEDY)
    assert [o.token_ids for o in outputs] == alone
    assert all(o.finish_reason is FinishReason.LENGTH for o in outputs)


@pytest.mark.parametrize("engine", [{"num_blocks": 16, "block_size": 16}], indirect=True)
def test_preemption_keeps_greedy_tokens(engine: LLM, alone: list[list[int]]) -> None:
    outputs = engine.generate(_prompts(), GREEDY)
    assert [o.token_ids for o in outputs] == alone
    assert sum(o.timings.num_preemptions for o in outputs if o.timings) > 0  # the pool was too small


def test_usage_and_timings(engine: LLM) -> None:
    out = engine.generate(["Hello there"], SamplingParams(max_tokens=5, temperature=0, ignore_eos=True))[0]
    assert out.usage is not None
    assert out.timings is not None
    assert out.usage.prompt_tokens == len(engine.tokenizer.encode("Hello there"))
    assert out.usage.completion_tokens == len(out.token_ids) == 5
    assert 0 <= out.timings.queue_s <= out.timings.ttft_s <= out.timings.total_s


def test_prefix_cache_reports_cached_tokens(engine: LLM) -> None:
    prompt = " ".join(WORDS * 4)
    params = SamplingParams(max_tokens=2, temperature=0)
    first, second = engine.generate([prompt], params)[0], engine.generate([prompt], params)[0]
    assert first.usage is not None and first.usage.cached_tokens == 0
    assert second.usage is not None and second.usage.cached_tokens >= 16
    assert second.token_ids == first.token_ids


def test_seeded_sampling_is_the_same_whatever_the_batch(engine: LLM) -> None:
    seeded = SamplingParams(max_tokens=16, temperature=1.0, top_p=0.95, seed=1234, ignore_eos=True)
    other = SamplingParams(max_tokens=16, temperature=1.0, ignore_eos=True)
    alone = engine.generate(["Once upon a time"], seeded)[0].token_ids
    crowd = engine.generate(
        ["Once upon a time", "A", "The weather today", "Once upon a time"], [seeded, other, other, other]
    )
    assert crowd[0].token_ids == alone
    assert crowd[3].token_ids != alone  # same prompt, no seed: a different draw


def test_stop_string_split_across_tokens(engine: LLM) -> None:
    prompt = "The capital of France is"
    base = engine.generate([prompt], SamplingParams(max_tokens=16, temperature=0))[0]
    tokens = [engine.tokenizer.decode([t]) for t in base.token_ids]
    # a stop string made of the end of one token and the start of the next
    i = next(i for i in range(1, len(tokens)) if len(tokens[i - 1].strip()) >= 2 and tokens[i].strip())
    stop = tokens[i - 1][-2:] + tokens[i][:1]
    out = engine.generate([prompt], SamplingParams(max_tokens=16, temperature=0, stop=[stop]))[0]
    assert out.finish_reason is FinishReason.STOP
    assert out.text == base.text[: base.text.index(stop)]
    assert stop not in out.text


def test_eos_and_stop_token_ids_end_the_request(engine: LLM) -> None:
    chat = engine.tokenizer.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
    out = engine.generate([chat], SamplingParams(max_tokens=64, temperature=0))[0]
    assert "Paris" in out.text
    assert out.finish_reason is FinishReason.STOP
    assert out.token_ids[-1] in engine.core.eos_token_ids
    first = out.token_ids[0]
    stopped = engine.generate([chat], SamplingParams(max_tokens=64, temperature=0, stop_token_ids=[first]))[0]
    assert stopped.token_ids == [first]
    assert stopped.finish_reason is FinishReason.STOP


def test_min_tokens_holds_back_eos(engine: LLM) -> None:
    chat = engine.tokenizer.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
    natural = engine.generate([chat], SamplingParams(max_tokens=32, temperature=0))[0]
    assert natural.finish_reason is FinishReason.STOP
    longer = engine.generate(
        [chat], SamplingParams(max_tokens=64, temperature=0, min_tokens=len(natural.token_ids) + 3)
    )[0]
    assert len(longer.token_ids) >= len(natural.token_ids) + 3


def test_logprobs_are_returned_per_token(engine: LLM) -> None:
    out = engine.generate(["Hello"], SamplingParams(max_tokens=3, temperature=0, logprobs=2, ignore_eos=True))[0]
    assert out.logprobs is not None and len(out.logprobs) == 3
    for token_id, lp in zip(out.token_ids, out.logprobs, strict=True):
        assert lp.token_id == token_id
        assert lp.logprob <= 0
        assert len(lp.top) == 2
        assert lp.top[0][0] == token_id  # greedy: the sampled token is the most likely one


@pytest.mark.parametrize(
    ("prompt", "params", "field"),
    [
        ("", SamplingParams(), "prompt"),
        ("hi", SamplingParams(max_tokens=10_000), "max_tokens"),
        ([10**9], SamplingParams(), "prompt_token_ids"),
    ],
)
def test_bad_input_is_refused_and_nothing_is_enqueued(
    engine: LLM, prompt: Any, params: SamplingParams, field: str
) -> None:
    with pytest.raises(ValueError, match=field):
        engine.generate([prompt], params)
    assert not engine.core.has_work


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"), ({"max_tokens": 0}, "max_tokens")],
)
def test_out_of_range_parameters_name_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_failing_request_fails_alone(engine: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    poison = 4242
    execute = engine.core.runner.execute

    def flaky(work: Any) -> torch.Tensor:
        if any(poison in w.token_ids for w in work):
            raise RuntimeError("poisoned batch")
        return execute(work)

    monkeypatch.setattr(engine.core.runner, "execute", flaky)
    outs = engine.generate([[1, 2, 3], [5, poison, 6], [7, 8]], GREEDY)
    assert outs[1].finish_reason is FinishReason.ERROR
    assert outs[1].error is not None and "poisoned" in outs[1].error
    assert [o.finish_reason for o in (outs[0], outs[2])] == [FinishReason.LENGTH] * 2
    assert all(len(o.token_ids) == GREEDY.max_tokens for o in (outs[0], outs[2]))


@pytest.mark.parametrize("engine", [{"max_waiting_requests": 2}], indirect=True)
def test_full_queue_is_refused_at_once(engine: LLM) -> None:
    outputs: list[Any] = []
    for i in range(2):
        engine.core.add_request(f"q{i}", [1, 2, 3], GREEDY, outputs.append)
    with pytest.raises(QueueFullError, match="max_waiting_requests"):
        engine.core.add_request("q2", [1, 2, 3], GREEDY, outputs.append)
    while engine.core.has_work:
        engine.core.step()
    assert sum(o.finished for o in outputs) == 2


@pytest.mark.parametrize("engine", [{"enable_prefix_caching": False, "max_num_batched_tokens": 16}], indirect=True)
def test_stats_count_prompt_and_generated_tokens(engine: LLM) -> None:
    prompts = _prompts()[:4]
    outputs = engine.generate(prompts, GREEDY)
    stats = engine.core.stats()
    assert stats.num_prompt_tokens_total == sum(len(p) for p in prompts)
    assert stats.num_generation_tokens_total == sum(len(o.token_ids) for o in outputs)
    assert stats.num_running == stats.num_waiting == stats.num_blocks_used == 0


def test_queued_tokens_count_requests_the_scheduler_has_not_seen(engine: LLM) -> None:
    prompts = _prompts()[:3]
    outputs: list[Any] = []
    for i, prompt in enumerate(prompts):
        engine.core.add_request(f"q{i}", prompt, GREEDY, outputs.append)
    # nothing has stepped: the requests are still in the engine's inbox, yet they are work ahead of a newcomer
    assert engine.core.stats().queued_tokens == sum(len(p) for p in prompts)
    engine.core.prefill_throughput.tokens_per_s = 100.0
    assert engine.core.predict_ttft_s(10) == pytest.approx((sum(len(p) for p in prompts) + 10) / 100)
    while engine.core.has_work:
        engine.core.step()
    assert sum(o.finished for o in outputs) == 3 and engine.core.stats().queued_tokens == 0


def test_predicted_ttft_uses_the_prefill_rate_not_the_decode_rate(engine: LLM) -> None:
    # one long prefill, then many one-token decode steps: the rate of all tokens falls to the decode rate
    engine.generate([list(range(1000, 1200))], SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))
    core = engine.core
    assert core.prefill_throughput.tokens_per_s > 5 * core.throughput.tokens_per_s
    assert core.predict_ttft_s(500) == pytest.approx(500 / core.prefill_throughput.tokens_per_s)
