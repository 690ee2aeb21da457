"""RequestStream: the deltas of one request, for asyncio callers, and the contract for leaving early.

    async with engine.generate(prompt, params) as stream:   # leaving the block aborts an unfinished request
        async for delta in stream:
            ...

A stream aborts its request when it is closed (`aclose()`, the end of `async with`, `contextlib.aclosing`)
or dropped (garbage-collected) before the request finished. Breaking out of `async for` alone does
neither while the caller still holds the stream: the request keeps its engine slot and KV blocks until
the stream is closed or dropped, as a file stays open until closed.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from types import TracebackType

from infer.engine.request import RequestOutput


class RequestStream:
    def __init__(self, request_id: str, deltas: asyncio.Queue[RequestOutput], abort: Callable[[str], None]) -> None:
        self.request_id = request_id
        self._deltas = deltas
        self._finished = False
        self._abort = weakref.finalize(self, abort, request_id)  # when dropped unfinished

    @property
    def finished(self) -> bool:
        return self._finished

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._finished:
            raise StopAsyncIteration
        out = await self._deltas.get()
        if out.finished:
            self._finished = True
            self._abort.detach()  # nothing left to abort
        return out

    async def aclose(self) -> None:
        """Abort the request unless it finished; the stream ends."""
        self._finished = True
        self._abort()  # runs at most once; a no-op once detached

    async def __aenter__(self) -> RequestStream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
