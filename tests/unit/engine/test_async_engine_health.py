"""AsyncEngine.problem (what the server's health check asks the engine) and its thread (fake engine, no weights)."""

from __future__ import annotations

import threading
import time

import pytest

from infer.engine.async_engine import AsyncEngine
from infer.engine.config import EngineConfig
from infer.engine.core import EngineCore
from infer.engine.loader import ModelLoadError
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
        _wait(lambda: not core.is_in_flight("r"))
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


def test_from_config_loads_on_the_thread_that_runs_the_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    # NOTE: the first thread to start an OpenMP team runs its parallel regions fastest (libgomp); loading on
    # another thread first halved batch-1 decode speed
    loaded_on: list[str] = []

    def build(config: EngineConfig) -> EngineCore:
        loaded_on.append(threading.current_thread().name)
        return fake_core()[0]

    monkeypatch.setattr(EngineCore, "from_config", staticmethod(build))
    engine = AsyncEngine.from_config(EngineConfig())
    try:
        assert loaded_on == [engine._thread.name] and engine._thread.is_alive()
        assert engine.problem(stall_timeout_s=10) is None
    finally:
        engine.shutdown()


def test_a_failed_load_raises_from_from_config_and_leaves_no_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    def build(config: EngineConfig) -> EngineCore:
        raise ModelLoadError("no such model")

    monkeypatch.setattr(EngineCore, "from_config", staticmethod(build))
    before = threading.active_count()
    with pytest.raises(ModelLoadError, match="no such model"):
        AsyncEngine.from_config(EngineConfig())
    assert threading.active_count() == before


def test_the_thread_waits_on_the_cores_wait_for_work_and_stops_through_wake(monkeypatch: pytest.MonkeyPatch) -> None:
    core, _ = fake_core()
    waits: list[str] = []
    wait_for_work = core.wait_for_work

    def recording() -> None:
        waits.append(threading.current_thread().name)
        wait_for_work()

    monkeypatch.setattr(core, "wait_for_work", recording)
    engine = AsyncEngine(core)
    try:
        _wait(lambda: waits)  # idle: it sleeps in the core's own wait, not on the core's insides
        num_waits = len(waits)
        finished = threading.Event()
        core.add_request("r", [5, 6], SamplingParams(max_tokens=3), lambda out: out.finished and finished.set())
        assert finished.wait(10)  # a request wakes it
        _wait(lambda: len(waits) > num_waits)  # and it goes back to waiting once done
        assert set(waits) == {engine._thread.name}
    finally:
        engine.shutdown()
    assert not engine._thread.is_alive()  # shutdown woke it through the core's `wake`


def test_steps_that_raise_are_a_problem_logged_once_until_a_step_passes(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    core, _ = fake_core()
    real_step, is_broken = core.step, threading.Event()
    is_broken.set()

    def step() -> bool:
        if is_broken.is_set():
            raise KeyError("r0")  # as a scheduler table that names a finished request did, on every step
        return real_step()

    monkeypatch.setattr(core, "step", step)
    engine = AsyncEngine(core)
    try:
        finals: list[str | None] = []
        for i in range(3):
            core.add_request(f"r{i}", [5, 6], SamplingParams(max_tokens=2), lambda out: finals.append(out.error))
        _wait(lambda: len(finals) == 3)
        assert finals == ["RuntimeError: engine step failed"] * 3
        assert "engine steps are failing (KeyError" in (engine.problem(stall_timeout_s=60) or "")
        failures = [r for r in caplog.records if r.levelname == "ERROR"]
        assert len(failures) == 1 and "failing every request" in failures[0].getMessage()  # not one a request
        is_broken.clear()
        _wait(lambda: engine.problem(stall_timeout_s=60) is None)  # the next step passes, with no request
        served: list[int] = []
        core.add_request("after", [5, 6], SamplingParams(max_tokens=2), lambda out: served.extend(out.token_ids))
        _wait(lambda: len(served) == 2)
    finally:
        engine.shutdown()
