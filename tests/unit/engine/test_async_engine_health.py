"""AsyncEngine.problem: what the server's health check asks the engine (fake engine, no weights)."""

from __future__ import annotations

import time

import pytest

from infer.engine.async_engine import AsyncEngine
from infer.engine.sampling_params import SamplingParams
from tests.helpers.fake_engine import fake_core


class _Dies(BaseException):
    """Not an Exception: the step loop does not survive it."""


def _wait(predicate: object, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_stalled_step_is_a_problem_until_it_ends() -> None:
    core, runner = fake_core()
    engine = AsyncEngine(core)
    try:
        assert engine.problem(stall_timeout_s=0.05) is None
        runner.gate.clear()
        core.add_request("r", [5, 6], SamplingParams(), lambda out: None)
        _wait(lambda: engine.problem(stall_timeout_s=0.05) is not None)
        assert "engine step has run for" in (engine.problem(stall_timeout_s=0.05) or "")
        runner.gate.set()
        _wait(lambda: not core.live)
        assert engine.problem(stall_timeout_s=0.05) is None
    finally:
        runner.gate.set()
        engine.shutdown()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_engine_thread_is_a_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    core, _ = fake_core()

    def die() -> bool:
        raise _Dies

    monkeypatch.setattr(core, "step", die)
    engine = AsyncEngine(core)
    _wait(lambda: not engine._thread.is_alive())
    assert engine.problem(stall_timeout_s=60) == "the engine thread has stopped"
    engine.shutdown()
    assert engine.problem(stall_timeout_s=60) is None  # stopped on purpose
