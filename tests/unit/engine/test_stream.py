"""RequestStream: how a caller leaves a request early, on the fake engine (no weights)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest

from infer.engine.async_engine import AsyncEngine
from infer.engine.request import FinishReason
from infer.engine.sampling_params import SamplingParams
from tests.helpers.engine_state import is_idle
from tests.helpers.fake_engine import fake_core

LONG = SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)


@pytest.fixture
def engine() -> Iterator[AsyncEngine]:
    core, runner = fake_core()
    runner.step_s = 0.005  # a request of 200 tokens outlives each test's checks
    eng = AsyncEngine(core)
    yield eng
    eng.shutdown()
    core.block_manager.assert_no_leaks()


async def _until(predicate: object, timeout_s: float = 10) -> None:
    for _ in range(int(timeout_s / 0.01)):
        if predicate():  # type: ignore[operator]
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out")


def _idle(engine: AsyncEngine) -> bool:
    return is_idle(engine.core)


def test_leaving_async_with_aborts_at_once(engine: AsyncEngine) -> None:
    async def main() -> None:
        gc.disable()  # no help from the garbage collector
        try:
            async with engine.generate([5, 6], LONG, "with") as stream:
                async for _ in stream:
                    break
            await _until(lambda: _idle(engine))
        finally:
            gc.enable()

    asyncio.run(main())


def test_a_held_stream_runs_until_closed(engine: AsyncEngine) -> None:
    async def main() -> None:
        stream = engine.generate([5, 6], LONG, "held")
        async for _ in stream:
            break
        await asyncio.sleep(0.05)
        assert engine.core.is_in_flight("held")  # the documented contract: held and not closed, it goes on
        await stream.aclose()
        await _until(lambda: _idle(engine))
        assert stream.finished

    asyncio.run(main())


def test_a_dropped_stream_aborts(engine: AsyncEngine) -> None:
    async def main() -> None:
        stream = engine.generate([5, 6], LONG, "dropped")
        await stream.__anext__()
        del stream  # no reference left
        gc.collect()
        await _until(lambda: _idle(engine))

    asyncio.run(main())


def test_a_finished_stream_aborts_nothing(engine: AsyncEngine) -> None:
    async def main() -> list[FinishReason | None]:
        async with engine.generate([5, 6], SamplingParams(max_tokens=3, ignore_eos=True), "done") as stream:
            reasons = [d.finish_reason async for d in stream]
        engine.generate([7], SamplingParams(max_tokens=1), "done")  # the id is free again: nothing pending
        await _until(lambda: _idle(engine))
        return reasons

    assert asyncio.run(main()) == [None, None, FinishReason.LENGTH]


def test_bad_input_is_refused_by_the_call_itself(engine: AsyncEngine) -> None:
    async def main() -> None:
        with pytest.raises(ValueError, match="prompt: must not be empty"):
            engine.generate([], LONG)

    asyncio.run(main())
