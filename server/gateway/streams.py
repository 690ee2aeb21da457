"""The n Generate streams of one HTTP request: opened together, gathered or merged into SSE, cancelled together.

Leaving early (a client disconnect, an error in a sibling stream, shutdown) cancels every gRPC
call, which aborts the requests in the engine and frees their KV blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from infer.api import pb
from infer.clients import GenerateStream, InferError
from infer.server.gateway.errors import APIError, from_grpc
from infer.server.gateway.render import Choice, Format
from infer.server.gateway.upstream import Metadata, Upstream

T = TypeVar("T")
DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
SHUTTING_DOWN = APIError(503, "the gateway is shutting down", code="service_unavailable")


class ClientDisconnectedError(Exception):
    """The HTTP client went away before its response was ready."""


class ChoiceStream:
    """One choice's Generate call, read message by message."""

    def __init__(self, index: int, stream: GenerateStream) -> None:
        self.index, self.stream = index, stream
        self._first: pb.GenerateResponse | None = None

    async def read(self) -> pb.GenerateResponse | None:
        """The next message; None at the end of the stream. A failed call raises its APIError."""
        if self._first is not None:
            first, self._first = self._first, None
            return first
        try:
            return await self.stream.read()
        except InferError as e:
            raise from_grpc(e) from None

    async def prefetch(self) -> None:
        """Wait for the first message: errors (queue full, bad input, ...) surface before any HTTP header."""
        self._first = await self.read()

    def cancel(self) -> None:
        self.stream.cancel()  # a no-op once the call has ended


def _cancel(streams: Sequence[ChoiceStream]) -> None:
    for s in streams:
        s.cancel()


async def start(upstream: Upstream, requests: Sequence[pb.GenerateRequest], metadata: Metadata) -> list[ChoiceStream]:
    """Open one stream per choice and wait for each one's first message."""
    streams = [ChoiceStream(i, upstream.generate(r, metadata)) for i, r in enumerate(requests)]
    try:
        await asyncio.gather(*(s.prefetch() for s in streams))
    except BaseException:
        _cancel(streams)
        raise
    return streams


async def collect(streams: Sequence[ChoiceStream]) -> list[Choice]:
    """Every choice, gathered to its end."""
    choices = [Choice(s.index) for s in streams]

    async def drain(stream: ChoiceStream, choice: Choice) -> None:
        while (response := await stream.read()) is not None:
            choice.add(response)

    try:
        await asyncio.gather(*(drain(s, c) for s, c in zip(streams, choices, strict=True)))
    finally:
        _cancel(streams)
    return choices


async def merged(streams: Sequence[ChoiceStream]) -> AsyncGenerator[tuple[int, pb.GenerateResponse]]:
    """(choice index, message) as they arrive from all streams; the first failure raises its APIError."""
    queue: asyncio.Queue[tuple[int, pb.GenerateResponse | APIError | None]] = asyncio.Queue()

    async def pump(stream: ChoiceStream) -> None:
        try:
            while (response := await stream.read()) is not None:
                queue.put_nowait((stream.index, response))
        except APIError as e:
            queue.put_nowait((stream.index, e))
        queue.put_nowait((stream.index, None))

    tasks = [asyncio.create_task(pump(s)) for s in streams]
    num_open = len(streams)
    try:
        while num_open:
            index, item = await queue.get()
            if item is None:
                num_open -= 1
            elif isinstance(item, APIError):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        _cancel(streams)
        await asyncio.gather(*tasks, return_exceptions=True)


def sse(data: Mapping[str, Any]) -> bytes:
    """One event; strict JSON like JSONResponse (no NaN: render.py keeps every float finite)."""
    return b"data: " + json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode() + b"\n\n"


async def sse_events(
    streams: Sequence[ChoiceStream],
    fmt: Format,
    on_done: Callable[[Sequence[Choice]], None],
    on_error: Callable[[APIError], None],
) -> AsyncGenerator[bytes]:
    """The SSE body: chunks, the usage chunk when asked, `[DONE]`; an error mid-stream is one error event."""
    choices = [Choice(s.index) for s in streams]
    try:
        async with contextlib.aclosing(merged(streams)) as messages:
            async for index, response in messages:
                choice = choices[index]
                choice.add(response)
                for chunk in fmt.chunks(choice, response):
                    yield sse(chunk)
        if fmt.meta.include_usage:
            yield sse(fmt.usage_chunk(choices))
        on_done(choices)
    except APIError as e:
        on_error(e)
        yield sse(e.body())
    yield DONE


async def _wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(receive: Receive, work: Awaitable[T]) -> T:
    """`work`'s result; cancelled (and ClientDisconnectedError raised) if the client goes away first."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_wait_for_disconnect(receive))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        task.cancel()  # a no-op when it is done
        await asyncio.gather(task, watch, return_exceptions=True)
    if task.cancelled():
        raise ClientDisconnectedError
    return task.result()


class EventStreamResponse(Response):
    """text/event-stream that stops (closing its event generator) as soon as the client disconnects."""

    media_type = "text/event-stream"

    def __init__(
        self,
        events: AsyncGenerator[bytes],
        headers: Mapping[str, str],
        on_disconnect: Callable[[], None] | None = None,
    ) -> None:
        self.events, self.on_disconnect = events, on_disconnect
        self.status_code, self.background = 200, None
        self.init_headers(SSE_HEADERS | dict(headers))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        sending = asyncio.ensure_future(self._send_events(send))
        watch = asyncio.ensure_future(_wait_for_disconnect(receive))
        try:
            await asyncio.wait({sending, watch}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            # NOTE: the server stops past its grace period: end the stream with an error, not a cut connection
            await self._close(sending, watch)
            await self._send_last(send, sse(SHUTTING_DOWN.body()) + DONE)
            return
        await self._close(sending, watch)
        if watch.done() and not watch.cancelled() and self.on_disconnect is not None:
            self.on_disconnect()
        error = None if sending.cancelled() else sending.exception()
        if isinstance(error, Exception) and not isinstance(error, OSError):  # OSError: the client left (ASGI 2.4)
            raise error

    async def _close(self, sending: asyncio.Future[None], watch: asyncio.Future[None]) -> None:
        sending.cancel()
        watch.cancel()
        await asyncio.gather(sending, watch, return_exceptions=True)
        await self.events.aclose()  # cancels the gRPC calls when the stream was left early

    @staticmethod
    async def _send_last(send: Send, body: bytes) -> None:
        with contextlib.suppress(Exception):
            await send({"type": "http.response.body", "body": body, "more_body": False})

    async def _send_events(self, send: Send) -> None:
        async for event in self.events:
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
