"""Prompt workers: short prompts never wait behind long ones; the long lane refuses past its bound."""

from __future__ import annotations

import asyncio
import threading

import pytest

from infer.engine import QueueFullError
from infer.server.convert import InputSize
from infer.server.prompt_workers import SHORT_PROMPT_CHARS, SHORT_PROMPT_MESSAGES, PromptWorkers, is_short

SHORT = InputSize(num_chars=100, num_messages=2)
LONG = InputSize(num_chars=SHORT_PROMPT_CHARS + 1)


def test_a_prompt_is_long_by_its_characters_or_its_messages() -> None:
    assert is_short(SHORT) and is_short(InputSize(num_token_ids=10_000))
    assert not is_short(LONG) and not is_short(InputSize(num_messages=SHORT_PROMPT_MESSAGES + 1))


def test_short_prompts_run_while_the_long_lane_is_stuck_and_it_refuses_past_its_bound() -> None:
    release = threading.Event()

    def stuck() -> str:
        release.wait(20)
        return "long"

    async def scenario() -> None:
        workers = PromptWorkers(max_pending_long_prompts=2)
        long_ones = [asyncio.ensure_future(workers.run(LONG, stuck)) for _ in range(2)]
        await asyncio.sleep(0.05)
        assert workers.num_pending_long == 2
        with pytest.raises(QueueFullError, match="max_pending_long_prompts"):
            await workers.run(LONG, stuck)
        assert await asyncio.wait_for(workers.run(SHORT, lambda: "short"), 10) == "short"
        release.set()
        assert await asyncio.wait_for(asyncio.gather(*long_ones), 10) == ["long", "long"]
        assert workers.num_pending_long == 0

    asyncio.run(scenario())


def test_a_cancelled_caller_frees_its_place_once_its_work_is_done() -> None:
    release = threading.Event()

    async def scenario() -> None:
        workers = PromptWorkers(max_pending_long_prompts=2)
        running = asyncio.ensure_future(workers.run(LONG, lambda: release.wait(20)))
        queued = asyncio.ensure_future(workers.run(LONG, lambda: True))
        await asyncio.sleep(0.05)
        queued.cancel()  # never started: cancelled with its caller
        running.cancel()  # already running: holds its place until it returns
        await asyncio.sleep(0.05)
        assert workers.num_pending_long == 1
        release.set()
        for _ in range(200):
            if workers.num_pending_long == 0:
                break
            await asyncio.sleep(0.02)
        assert workers.num_pending_long == 0
        assert await workers.run(LONG, lambda: "again") == "again"

    asyncio.run(scenario())


def test_the_bound_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_pending_long_prompts"):
        PromptWorkers(0)
