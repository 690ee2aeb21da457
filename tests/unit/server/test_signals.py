"""run_until_signal: the one stop flow of `infer serve` and `infer gateway`."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from infer.server.signals import run_until_signal


def test_a_signal_cancels_the_serving_coroutine_which_unwinds() -> None:
    unwound: list[str] = []

    async def serving() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0)  # a graceful stop may await
            unwound.append("stopped")

    async def main() -> bool:
        asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), signal.SIGTERM)
        return await run_until_signal(serving())

    assert asyncio.run(main()) is True
    assert unwound == ["stopped"]


def test_serving_that_ends_by_itself_is_not_a_signal() -> None:
    async def serving() -> None:
        await asyncio.sleep(0.01)

    assert asyncio.run(run_until_signal(serving())) is False


def test_its_failure_propagates_and_the_handlers_are_gone() -> None:
    async def serving() -> None:
        raise OSError("port in use")

    async def main() -> None:
        with pytest.raises(OSError, match="port in use"):
            await run_until_signal(serving())
        assert not asyncio.get_running_loop().remove_signal_handler(signal.SIGINT)  # none left installed

    asyncio.run(main())
