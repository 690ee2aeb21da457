"""Serve until SIGTERM or SIGINT: the one stop flow of `infer serve` and `infer gateway`."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Coroutine
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


async def run_until_signal(serving: Coroutine[Any, Any, None]) -> bool:
    """Run `serving` until it returns, or until SIGTERM / SIGINT cancels it (it stops gracefully on cancel).

    True when a signal stopped it. Its exception, if it fails, propagates.
    """
    task = asyncio.ensure_future(serving)
    loop = asyncio.get_running_loop()
    signalled = asyncio.Event()

    def on_signal() -> None:
        signalled.set()
        task.cancel()

    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, on_signal)
    try:
        await asyncio.wait({task})
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)
        task.cancel()  # a no-op when it is done; else our own caller was cancelled
    if not task.cancelled():
        task.result()  # raises what it raised
    return signalled.is_set()
