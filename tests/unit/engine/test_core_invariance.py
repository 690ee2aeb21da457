"""Batch invariance on the real default model, in every precision: a request's tokens and logprobs never depend
on its batch.

For each precision, 6 of the 8 parity prompts (chat-formatted: they share the system prompt's blocks) are run
alone, greedy and with a per-request seed (the seeded ones with logprobs); then all 12 requests together,
with 16-token prefill chunks, through a KV pool small enough to preempt, and after their shared prefix is
cached. Every run must give every request the tokens and the logprobs it got alone, bit for bit: greedy
argmax and seeded draws both read logits that must not move by one ulp, and a one-ulp drift that leaves the
tokens alone still moves a logprob (tests/mutants).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from infer import LLM, SamplingParams
from infer.engine import TokenLogprob, loader
from infer.engine.cuda_graphs import EagerGraphs, capture_sizes
from infer.engine.llm import CompletionOutput
from tests.helpers.bench_data import parity_prompts

PROMPTS = parity_prompts()[:6]  # benchmarks/precision.py's, as user messages (6 of 8: 12 requests, make test's time)
# engine settings per precision; int4 joins as one more entry
PRECISIONS = {
    "fp32": {},
    "bf16": {"dtype": "bfloat16"},
    "int8": {"quantization": "int8"},
    "int4": {"quantization": "int4"},
}
SCENARIOS = {  # engine settings beyond the precision's (prefix caching off); "batched" reuses the alone engine
    "batched": {},
    "chunk16": {"max_num_batched_tokens": 16},  # every prompt takes several steps, beside other requests
    "preempted": {"num_blocks": 16},  # 16 new tokens cross a block boundary: the 5 admitted cannot all grow
}


Result = tuple[list[int], list[TokenLogprob] | None]  # a request's tokens and logprobs, compared with ==


def _result(output: CompletionOutput) -> Result:
    return output.token_ids, output.logprobs


def _params(num_new: int) -> list[SamplingParams]:
    """A greedy and a seeded request per prompt (in PROMPTS' order, greedy first); the seeded one asks for
    logprobs (the greedy one keeps the argmax path that skips them)."""
    greedy = SamplingParams(max_tokens=num_new, temperature=0.0, ignore_eos=True)
    return [
        p
        for i in range(len(PROMPTS))
        for p in (
            greedy,
            SamplingParams(max_tokens=num_new, temperature=0.9, top_p=0.95, seed=100 + i, ignore_eos=True, logprobs=2),
        )
    ]


class Case:
    """One precision: each request's tokens and logprobs alone, and engines for the other runs (checked for
    leaks)."""

    def __init__(self, model_dir: Path, precision: str, num_new: int) -> None:
        self.model_dir, self.settings, self.params = model_dir, PRECISIONS[precision], _params(num_new)
        # NOTE: one engine runs each request alone, then all together (saves a model load per precision)
        self.plain = LLM(str(self.model_dir), max_model_len=128, enable_prefix_caching=False, **self.settings)
        chats = [self.plain.tokenizer.encode_chat([{"role": "user", "content": text}]) for text in PROMPTS]
        self.prompts = [p for p in chats for _ in range(2)]  # a greedy and a seeded request each
        self.alone: list[Result] = [
            _result(self.plain.generate([p], [s])[0]) for p, s in zip(self.prompts, self.params, strict=True)
        ]
        assert all(lps for i, (_, lps) in enumerate(self.alone) if i % 2), "every seeded request has logprobs"

    @contextmanager
    def engine(self, **settings: Any) -> Iterator[LLM]:
        llm = LLM(str(self.model_dir), max_model_len=128, **self.settings, **settings)
        yield llm
        llm.core.block_manager.assert_no_leaks()  # every run ends with every block free


# NOTE: bf16 and int8 run in `make test-slow` (~60 s of make test's budget); fp32 (the default model's precision, and
# the mutants') and int4 (the GGUF files' 4-bit weights) in make test
FAST_PRECISIONS = ("fp32", "int4")


@pytest.fixture(
    scope="module",
    params=[pytest.param(p, marks=() if p in FAST_PRECISIONS else pytest.mark.slow) for p in PRECISIONS],
)
def case(request: pytest.FixtureRequest, default_model_dir: Path) -> Case:
    return Case(default_model_dir, request.param, num_new=16)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_tokens_equal_alone(case: Case, scenario: str) -> None:
    if scenario == "batched":
        outputs = case.plain.generate(case.prompts, case.params)
        case.plain.core.block_manager.assert_no_leaks()
    else:
        with case.engine(enable_prefix_caching=False, **SCENARIOS[scenario]) as llm:
            outputs = llm.generate(case.prompts, case.params)
    assert [_result(o) for o in outputs] == case.alone
    if scenario == "preempted":
        assert sum(o.timings.num_preemptions for o in outputs if o.timings) > 0  # the pool was too small


def test_tokens_equal_alone_in_decode_steps_padded_as_cuda_graphs_pad_them(
    case: Case, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every decode step padded to the next captured batch size (1, 2, 4, 8, then every 8), as on CUDA with graphs
    on or off (EagerGraphs runs the padded steps here): the padding rows move no real row's logits."""
    graphs: list[EagerGraphs] = []

    def padded(device: Any, kernels: str, enabled: bool, max_num_seqs: int) -> EagerGraphs:
        graphs.append(EagerGraphs(capture_sizes(max_num_seqs)))
        return graphs[-1]

    monkeypatch.setattr(loader, "graphs_for", padded)
    with case.engine(enable_prefix_caching=False, max_num_seqs=16) as llm:
        outputs = llm.generate(case.prompts, case.params)
    assert [_result(o) for o in outputs] == case.alone
    assert graphs and graphs[0].num_replays >= 8  # the decode steps of the 12 requests, padded to 16


def test_tokens_equal_alone_after_prefix_hits(case: Case) -> None:
    with case.engine(enable_prefix_caching=True) as llm:
        llm.generate(case.prompts[:1], case.params[:1])  # caches the system prompt's full blocks
        outputs = llm.generate(case.prompts, case.params)
    assert all(o.usage is not None and o.usage.cached_tokens >= 16 for o in outputs)
    assert [_result(o) for o in outputs] == case.alone


@pytest.mark.slow
@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_long_outputs_equal_alone(default_model_dir: Path, precision: str) -> None:
    """64 new tokens a request: more steps for a difference to show (the long form of the tests above)."""
    long = Case(default_model_dir, precision, num_new=64)
    for settings in [{}, *SCENARIOS.values()]:
        with long.engine(enable_prefix_caching=True, **settings) as llm:
            outputs = llm.generate(long.prompts, long.params)
        assert [_result(o) for o in outputs] == long.alone, settings
