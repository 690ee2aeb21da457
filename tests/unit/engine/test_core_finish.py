"""However a request ends, it leaves no trace in the scheduler, and the next request is served.

Each finishing path (length, stop string, stop id, eos, abort while waiting or running, error), with and
without a constraint, on the fake runner. A constrained request is admitted in the step its grammar becomes
ready; one that then ended on its first token once stayed in the scheduler's set of requests whose grammar
is not ready, and every later step raised KeyError: the server was broken until restarted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from infer.engine.core import EngineCore
from infer.engine.request import FinishReason, RequestOutput
from infer.engine.sampling_params import SamplingParams
from infer.engine.structured import Constraint
from tests.helpers.fake_engine import TEXT, FakeRunner, fake_core

CONSTRAINTS: dict[str, Constraint | None] = {
    "none": None,
    "regex": Constraint.regex("[a-z ,.A-Z]{1,40}"),
    "json": Constraint.json_schema({"type": "object", "properties": {"a": {"type": "string"}}}),
}
POISON = 299  # a prompt token that makes the fake runner's forward pass fail


@pytest.fixture
def fake() -> Iterator[tuple[EngineCore, FakeRunner]]:
    core, runner = fake_core()
    runner.poison = {POISON}
    yield core, runner
    core.block_manager.assert_no_leaks()


def _run(core: EngineCore, timeout_s: float = 60.0) -> None:
    deadline_s = time.monotonic() + timeout_s  # a grammar compiles on another thread meanwhile
    while core.has_work:
        assert time.monotonic() < deadline_s, "the requests did not end"
        core.step()


def _prompt(core: EngineCore) -> list[int]:
    return core.tokenizer.encode(TEXT)[:5]


def _first_token(core: EngineCore, constraint: Constraint | None) -> RequestOutput:
    """The request's output with max_tokens 1: its first token, as the stops below are built from it."""
    outputs: list[RequestOutput] = []
    params = SamplingParams(max_tokens=1, temperature=0.0, constraint=constraint)
    core.add_request("probe", _prompt(core), params, outputs.append)
    _run(core)
    assert outputs[-1].finished and outputs[-1].token_ids, outputs[-1]
    return outputs[-1]


def _finish(core: EngineCore, constraint: Constraint | None, path: str) -> RequestOutput:
    """One request that ends by `path`; its final output."""
    outputs: list[RequestOutput] = []
    greedy = SamplingParams(max_tokens=30, temperature=0.0, constraint=constraint)
    prompt = _prompt(core)
    if path == "length":
        params = SamplingParams(max_tokens=1, temperature=0.0, constraint=constraint)
    elif path == "stop_string":
        first = _first_token(core, constraint)
        params = SamplingParams(max_tokens=30, temperature=0.0, constraint=constraint, stop=(first.text,))
    elif path == "stop_id":
        first = _first_token(core, constraint)
        params = SamplingParams(max_tokens=30, temperature=0.0, constraint=constraint,
                                stop_token_ids=(first.token_ids[0],))  # fmt: skip
    elif path == "error":
        params, prompt = greedy, [*prompt, POISON]
    else:
        params = greedy
    core.add_request("r", prompt, params, outputs.append)
    if path == "abort_waiting":
        core.abort("r")
    elif path == "abort_running":
        while not any(core.scheduler.requests[rid].status.name == "RUNNING" for rid in core.scheduler.requests):
            core.step()
        core.abort("r")
    _run(core)
    assert outputs and outputs[-1].finished
    return outputs[-1]


PATHS: dict[str, Callable[[FinishReason], bool]] = {
    "length": lambda reason: reason is FinishReason.LENGTH,
    "stop_string": lambda reason: reason is FinishReason.STOP,
    "stop_id": lambda reason: reason is FinishReason.STOP,
    "abort_waiting": lambda reason: reason is FinishReason.ABORT,
    "abort_running": lambda reason: reason is FinishReason.ABORT,
    "error": lambda reason: reason is FinishReason.ERROR,
}


@pytest.mark.parametrize("constraint", list(CONSTRAINTS))
@pytest.mark.parametrize("path", list(PATHS))
def test_a_finished_request_leaves_no_trace_and_the_next_one_is_served(
    fake: tuple[EngineCore, FakeRunner], path: str, constraint: str
) -> None:
    core, _ = fake
    final = _finish(core, CONSTRAINTS[constraint], path)
    assert PATHS[path](final.finish_reason), final
    assert not core.scheduler.holds("r") and not core.scheduler.requests
    after: list[RequestOutput] = []
    core.add_request("next", _prompt(core), SamplingParams(max_tokens=3, temperature=0.0), after.append)
    _run(core)  # raised KeyError on every step after a constrained request ended on its first token
    assert after[-1].finish_reason is FinishReason.LENGTH and sum(len(o.token_ids) for o in after) == 3
