"""Speculative decoding on the default model: greedy tokens identical to plain greedy decoding over the parity
prompts (test_core_default_model.py) and prompts that copy from their input, across batching, chunked prefill
and preemption; seeded sampling gives the plain tokens too."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infer import LLM, SamplingParams
from infer.engine.sampling_params import SamplingParams as Params
from tests.unit.engine.test_core_default_model import _prompts as parity_prompts

PASSAGE = (
    "The lighthouse stood on a rock at the mouth of the harbour. Every night the keeper climbed the hundred "
    "and twelve steps, wound the clockwork, trimmed the wick and lit the lamp, and every morning he wrote the "
    "weather, the ships he had seen and the oil he had burned in a book bound in green leather."
)
TASKS = [
    f"Repeat the following passage word for word.\n\n{PASSAGE}\n\nPassage:",
    f"Rewrite this passage, replacing 'keeper' with 'warden'.\n\n{PASSAGE}\n\nRewritten:",
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n",
]
GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
NUM_PARITY = 8  # of the 16 parity prompts: 3 to 88 tokens


def _all_prompts(llm: LLM) -> list[list[int]]:
    chats = [llm.tokenizer.encode_chat([{"role": "user", "content": t}]) for t in TASKS[:2]]
    return parity_prompts()[:NUM_PARITY] + chats + [llm.tokenizer.encode(TASKS[2])]


@pytest.fixture(scope="module")
def plain(default_model_dir: Path) -> tuple[list[list[int]], list[list[int]]]:
    """The prompts and their plain greedy tokens."""
    llm = LLM(str(default_model_dir), max_model_len=512)
    prompts = _all_prompts(llm)
    tokens = [o.token_ids for o in llm.generate(prompts, GREEDY)]
    llm.core.block_manager.assert_no_leaks()
    return prompts, tokens


@pytest.fixture
def engine(request: pytest.FixtureRequest, default_model_dir: Path) -> Iterator[LLM]:
    settings: dict[str, Any] = {"max_model_len": 512, "speculative_tokens": 4, "speculative_max_num_seqs": 64}
    llm = LLM(str(default_model_dir), **{**settings, **getattr(request, "param", {})})
    yield llm
    assert not llm.core.has_work
    llm.core.block_manager.assert_no_leaks()  # rejected drafts' blocks came back too


@pytest.mark.parametrize(
    "engine",
    [{}, {"max_num_batched_tokens": 32}, {"num_blocks": 20, "max_model_len": 256}],
    indirect=True,
    ids=["continuous", "chunk32", "preempting"],
)
def test_speculative_greedy_equals_plain_greedy(engine: LLM, plain: tuple[list[list[int]], list[list[int]]]) -> None:
    prompts, expected = plain
    outputs = engine.generate(prompts, GREEDY)
    assert [o.token_ids for o in outputs] == expected
    stats = engine.core.stats()
    assert stats.num_accepted_tokens_total > 0  # drafts were verified and kept, not only proposed
    if engine.core.config.num_blocks == 20:
        assert stats.num_preemptions_total > 0


@pytest.mark.parametrize("engine", [{}], indirect=True)
def test_speculative_alone_copies_with_fewer_steps(engine: LLM, plain: tuple[list[list[int]], list[list[int]]]) -> None:
    prompts, expected = plain
    i = NUM_PARITY  # the "repeat the passage" chat
    out = engine.generate([prompts[i]], GREEDY)[0]
    assert out.token_ids == expected[i]
    assert out.timings is not None and out.timings.acceptance_rate > 0.5
    assert engine.core.num_steps < len(expected[i]) * 2 // 3  # 1.5 tokens a decode step or more


def test_seeded_sampling_is_unchanged_by_speculation(default_model_dir: Path) -> None:
    plain_llm = LLM(str(default_model_dir), max_model_len=512)
    spec_llm = LLM(str(default_model_dir), max_model_len=512, speculative_tokens=4)
    prompt = _all_prompts(plain_llm)[NUM_PARITY]
    params = [Params(max_tokens=16, temperature=0.5, top_p=0.9, seed=s, ignore_eos=True, logprobs=1) for s in range(3)]
    a, b = plain_llm.generate([prompt] * 3, params), spec_llm.generate([prompt] * 3, params)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert spec_llm.core.stats().num_accepted_tokens_total > 0
    for x, y in zip(a, b, strict=True):
        assert x.logprobs is not None and y.logprobs is not None
        assert x.logprobs == y.logprobs  # bit for bit: a verified draft's logits are those of a plain step
