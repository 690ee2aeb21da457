"""AsyncEngine: streaming from the core thread, abort, queue bound."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from infer.engine.async_engine import AsyncEngine, WarmupError
from infer.engine.config import EngineConfig
from infer.engine.request import FinishReason, RequestOutput
from infer.engine.sampling_params import SamplingParams
from tests.helpers.engine_state import is_idle

LONG = SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(default_model_dir: Path) -> Iterator[AsyncEngine]:
    eng = AsyncEngine.from_config(EngineConfig(model=str(default_model_dir), max_model_len=256))
    yield eng
    eng.shutdown()


async def _until_idle(engine: AsyncEngine) -> None:
    for _ in range(200):
        if is_idle(engine.core):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("engine did not become idle")


async def _collect(stream: AsyncIterator[RequestOutput]) -> list[RequestOutput]:
    return [d async for d in stream]


def test_stream_delivers_deltas_then_a_final_output(engine: AsyncEngine) -> None:
    async def main() -> list[RequestOutput]:
        return await _collect(engine.generate("Hello", SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)))

    deltas = asyncio.run(main())
    assert sum(len(d.token_ids) for d in deltas) == 5
    assert [d.finished for d in deltas] == [False] * (len(deltas) - 1) + [True]
    assert deltas[-1].finish_reason is FinishReason.LENGTH


def test_abort_mid_stream_frees_blocks(engine: AsyncEngine) -> None:
    async def main() -> None:
        got = 0
        async for _ in engine.generate("Tell me a long story", LONG, request_id="to-abort"):
            got += 1
            if got == 3:
                break  # leaving the stream aborts the request
        await _until_idle(engine)

    asyncio.run(main())
    engine.core.block_manager.assert_no_leaks()


def test_explicit_abort_ends_the_stream(engine: AsyncEngine) -> None:
    async def main() -> RequestOutput:
        last = None
        async for delta in engine.generate("Count to one hundred", LONG, request_id="abort-me"):
            last = delta
            engine.abort("abort-me")
        assert last is not None
        return last

    last = asyncio.run(main())
    assert last.finish_reason is FinishReason.ABORT
    engine.core.block_manager.assert_no_leaks()


def test_warmup_decodes_several_steps_and_fails_loudly() -> None:
    """The warm-up runs a prefill and several decode steps; a forward pass that fails in any of them raises
    (it used to end quietly, and the server reported SERVING over an engine that failed every request)."""
    from tests.helpers.fake_engine import fake_core

    core, runner = fake_core()
    engine = AsyncEngine(core)
    try:
        asyncio.run(engine.warmup())
        assert len(runner.calls) >= 8  # one prefill pass, then a decode pass per token after the first
        core.block_manager.assert_no_leaks()
        runner.calls.clear()
        runner.num_good_calls = 2  # the prefill and the first decode pass; the next one fails
        with pytest.raises(WarmupError, match="warm-up request failed"):
            asyncio.run(engine.warmup())
    finally:
        engine.shutdown()


def test_a_caller_that_leaves_drops_a_compile_no_one_else_waits_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow compile whose only caller's deadline passes is given up: its trial killed, never compiled here."""
    from tests.helpers.fake_engine import fake_core
    from tests.helpers.slow_grammar import SLOW_GRAMMAR, record_compiles

    seen = record_compiles(monkeypatch)
    core, _ = fake_core()
    engine = AsyncEngine(core)
    slow = SLOW_GRAMMAR

    async def main() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(engine.compile_constraint(slow), 0.3)
        for _ in range(100):
            if core.stats().num_grammars_pending == 0:
                return
            await asyncio.sleep(0.01)

    try:
        core.structured.compiler.start().result(timeout=60)
        asyncio.run(main())
        assert core.stats().num_grammars_pending == 0  # given up within a second, not compiled on
        assert not any(c.text == slow.text for c in seen) and core.stats().num_grammars_refused_total == 0
    finally:
        engine.shutdown()
