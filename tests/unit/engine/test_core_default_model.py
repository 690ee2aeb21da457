"""The engine on the real default model: batching never changes greedy tokens, whatever the settings.

The step loop's logic is tested without weights, on a fake runner, in test_core.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from infer import LLM, SamplingParams
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
