"""Constrained requests in the step loop, on the fake runner: outputs follow their constraint, end with it,
and stay the same whatever the batch, chunking, prefix hits or preemption; a grammar that compiles slowly or
not at all holds up no one else."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import xgrammar  # noqa: F401  (a hard dependency: missing, these tests fail)

from infer.engine.llm import LLM
from infer.engine.request import FinishReason, RequestOutput
from infer.engine.sampling_params import SamplingParams
from infer.engine.structured import Constraint
from infer.engine.structured import compiler as structured
from tests.helpers.fake_engine import FakeRunner, fake_core
from tests.helpers.slow_grammar import SLOW_GRAMMAR, record_compiles

CITIES = ["Paris", "London", "Rome"]
SMALL_INT = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
             "required": ["n"], "additionalProperties": False}  # fmt: skip
CONSTRAINTS = {
    "digits": (Constraint.regex("[0-9]{2,4}"), lambda text: re.fullmatch("[0-9]{2,4}", text)),
    "city": (Constraint.choice(CITIES), lambda text: text in CITIES),
    "json": (Constraint.json_schema(SMALL_INT), lambda text: 0 <= json.loads(text)["n"] <= 99),
    "words": (Constraint.regex("[a-z ]{24}"), lambda text: re.fullmatch("[a-z ]{24}", text)),  # ~24 tokens
}


@pytest.fixture
def fake(request: pytest.FixtureRequest) -> Iterator[tuple[LLM, FakeRunner]]:
    core, runner = fake_core(**getattr(request, "param", {}))
    yield LLM.from_core(core), runner
    assert not core.has_work and not core.scheduler.waiting  # none left compiling
    core.block_manager.assert_no_leaks()


@pytest.fixture
def llm(fake: tuple[LLM, FakeRunner]) -> LLM:
    return fake[0]


def constrained(name: str, **kw: Any) -> SamplingParams:
    return SamplingParams(**{"max_tokens": 40, "temperature": 0.0, "constraint": CONSTRAINTS[name][0], **kw})


def prompts(llm: LLM, n: int) -> list[list[int]]:
    """n prompts of 3 to ~70 tokens from the text the fake model knows."""
    ids = llm.tokenizer.encode("Hello world, the capital of France is Paris. " * 4)
    return [ids[: 3 + (i * 23) % 67] for i in range(n)]


@pytest.mark.parametrize("name", list(CONSTRAINTS))
def test_the_output_follows_the_constraint_and_ends_with_it(llm: LLM, name: str) -> None:
    check = CONSTRAINTS[name][1]
    greedy = llm.generate(prompts(llm, 1), constrained(name))[0]
    assert check(greedy.text), greedy.text
    assert greedy.finish_reason is FinishReason.STOP
    sampled = llm.generate(prompts(llm, 8), [constrained(name, temperature=1.5, seed=i) for i in range(8)])
    assert all(check(out.text) and out.finish_reason is FinishReason.STOP for out in sampled)


def test_the_constraint_ends_the_request_even_when_eos_is_ignored(llm: LLM) -> None:
    out = llm.generate(prompts(llm, 1), constrained("city", ignore_eos=True, max_tokens=30))[0]
    assert out.text in CITIES and out.finish_reason is FinishReason.STOP
    assert len(out.token_ids) < 30


MIXED_SETTINGS = [
    {},
    {"max_num_batched_tokens": 16},  # prompts come in chunks
    {"num_blocks": 12, "max_model_len": 128},  # too small for all at once: preemption
]


@pytest.mark.parametrize("fake", MIXED_SETTINGS, ids=["continuous", "chunk16", "preempting"], indirect=True)
def test_greedy_constrained_tokens_do_not_depend_on_the_batch(fake: tuple[LLM, FakeRunner]) -> None:
    llm, _ = fake
    names = [None if i % 4 == 0 else "words" if i % 2 else list(CONSTRAINTS)[i % 3] for i in range(12)]
    params = [constrained(n) if n else SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True) for n in names]
    batch = prompts(llm, 12)
    alone = [llm.generate([p], sp)[0] for p, sp in zip(batch, params, strict=True)]
    together = llm.generate(batch, params)
    assert [o.token_ids for o in together] == [o.token_ids for o in alone]
    if llm.core.config.num_blocks == 12:
        preempted = [o.timings.num_preemptions for o, n in zip(together, names, strict=True) if n and o.timings]
        assert sum(preempted) > 0, "no constrained request was preempted: the test lost its point"


def test_a_prefix_cache_hit_gives_the_same_constrained_tokens(llm: LLM) -> None:
    prompt = prompts(llm, 3)[2]
    first, second = (llm.generate([prompt], constrained("words"))[0] for _ in range(2))
    assert second.usage is not None and second.usage.cached_tokens > 0
    assert second.token_ids == first.token_ids


def test_a_constraint_that_does_not_compile_fails_its_request_alone(llm: LLM) -> None:
    free = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    bad = SamplingParams(max_tokens=6, constraint=Constraint.regex("(("))
    outs = llm.generate(prompts(llm, 2), [bad, free])
    assert outs[0].finish_reason is FinishReason.ERROR
    assert outs[0].error is not None and "regex: does not compile" in outs[0].error
    assert outs[1].finish_reason is FinishReason.LENGTH and len(outs[1].token_ids) == 6


@pytest.fixture
def slow_compiles(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Compiles wait until the event is set."""
    gate = threading.Event()
    compile_one = structured._compile

    def slow(backend: Any, constraint: Constraint) -> Any:
        assert gate.wait(30)
        return compile_one(backend, constraint)

    monkeypatch.setattr(structured, "_compile", slow)
    yield gate
    gate.set()


def test_a_slow_compile_holds_up_no_other_request(llm: LLM, slow_compiles: threading.Event) -> None:
    core = llm.core
    slow: list[RequestOutput] = []
    free: list[RequestOutput] = []
    prompt = prompts(llm, 1)[0]
    core.add_request("slow", prompt, constrained("digits"), slow.append)
    core.add_request("free", prompt, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True), free.append)
    while not (free and free[-1].finished):
        core.step()
    assert len(free) == 8 and slow == []
    assert core.stats().num_waiting == 1  # it waits, and is counted as waiting
    slow_compiles.set()
    while core.has_work:
        core.step()
    assert slow[-1].finish_reason is FinishReason.STOP
    assert re.fullmatch("[0-9]{2,4}", "".join(o.text for o in slow))


def test_an_abort_while_the_grammar_compiles(llm: LLM, slow_compiles: threading.Event) -> None:
    core = llm.core
    outs: list[RequestOutput] = []
    core.add_request("r", prompts(llm, 1)[0], constrained("city"), outs.append)
    core.step()
    core.abort("r")
    core.step()
    assert [o.finish_reason for o in outs] == [FinishReason.ABORT]
    assert not core.has_work


def test_an_aborted_request_drops_its_compile(llm: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = record_compiles(monkeypatch)
    core = llm.core
    core.structured.compiler.start().result(timeout=60)
    slow = SLOW_GRAMMAR
    left: list[RequestOutput] = []
    core.add_request("left", prompts(llm, 1)[0], SamplingParams(max_tokens=8, constraint=slow), left.append)
    core.step()
    core.abort("left")
    core.step()
    assert [o.finish_reason for o in left] == [FinishReason.ABORT]
    for _ in range(100):
        if core.stats().num_grammars_pending == 0:
            break
        time.sleep(0.01)
    assert core.stats().num_grammars_pending == 0  # given up within a second: its trial killed
    assert not any(c.text == slow.text for c in seen) and core.stats().num_grammars_refused_total == 0


ENUMS = {"type": "object", "additionalProperties": False, "required": ["color", "size"],
         "properties": {"color": {"enum": ["red", "green", "blue"]}, "size": {"enum": ["S", "M", "L"]}}}  # fmt: skip


@pytest.mark.slow  # loads the model twice; the same test on the fake runner runs in make test
def test_on_the_default_model_preemption_keeps_constrained_greedy_tokens(default_model_dir: Path) -> None:
    """Real logits: a constrained request preempted mid-output (recomputed) gives its tokens alone."""
    words = "the quick brown fox jumps over a lazy dog while seven wizards hum old songs".split()  # noqa: SIM905
    prompts = [" ".join(words[: 6 + 4 * i]) * 2 for i in range(4)]
    free = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    shaped = SamplingParams(max_tokens=24, temperature=0.0, constraint=Constraint.json_schema(ENUMS))
    params = [free, free, shaped, shaped]  # the constrained ones come last: preempted first
    roomy = LLM(str(default_model_dir), max_model_len=128)
    alone = [roomy.generate([p], sp)[0].token_ids for p, sp in zip(prompts, params, strict=True)]
    del roomy
    tight = LLM(str(default_model_dir), max_model_len=128, num_blocks=8)
    together = tight.generate(prompts, params)
    assert [o.token_ids for o in together] == alone
    assert sum(o.timings.num_preemptions for o in together[2:] if o.timings) > 0
    assert all(json.loads(o.text)["size"] in "SML" for o in together[2:])
    tight.core.block_manager.assert_no_leaks()
