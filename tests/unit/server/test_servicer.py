"""The servicer's cleanup when a client goes away while a response is being sent."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from infer.api import pb
from infer.engine.async_engine import AsyncEngine
from infer.engine.config import EngineConfig
from infer.server.lifecycle import Lifecycle
from infer.server.servicer import InferenceServicer
from infer.server.telemetry import Telemetry


class _ClientLeavesDuringSecondWrite:
    """The parts of grpc.aio.ServicerContext the servicer uses. The peer cancels while the second
    response is on its way: grpc.aio then cancels the RPC's task, so the pending send raises."""

    def __init__(self) -> None:
        self.writes: list[pb.GenerateResponse] = []
        self.gone = False

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def time_remaining(self) -> float | None:
        return None if not self.gone else 1.0

    def cancelled(self) -> bool:
        return self.gone

    async def write(self, message: pb.GenerateResponse) -> None:
        if len(self.writes) == 1:
            self.gone = True
            raise asyncio.CancelledError
        self.writes.append(message)

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise AssertionError(f"unexpected abort {code}: {details}")


async def _drive_like_grpc_aio(handler: Any, request: pb.GenerateRequest, context: Any) -> None:
    """How grpc.aio runs a server-streaming handler: await a coroutine, or `async for` over a generator
    and write each message (a generator is not closed when a write raises)."""
    if inspect.isasyncgenfunction(handler):
        async for message in handler(request, context):
            await context.write(message)
    else:
        await handler(request, context)


@pytest.fixture(scope="module")
def engine(default_model_dir: Path) -> Iterator[AsyncEngine]:
    engine = AsyncEngine.from_config(EngineConfig(model=str(default_model_dir), max_model_len=256))
    yield engine
    engine.shutdown()


def test_cancel_during_a_send_aborts_the_request_at_once(engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    aborted: list[str] = []
    abort = engine.core.abort
    monkeypatch.setattr(engine.core, "abort", lambda request_id: (aborted.append(request_id), abort(request_id)))
    spans = InMemorySpanExporter()
    telemetry = Telemetry(engine.core.stats, spans, batch_spans=False)
    lifecycle = Lifecycle()
    servicer = InferenceServicer(lifecycle, telemetry)
    context = _ClientLeavesDuringSecondWrite()
    request = pb.GenerateRequest(
        request_id="leaves", prompt="Tell me a story", sampling=pb.SamplingParams(max_tokens=200, ignore_eos=True)
    )

    async def main() -> None:
        await lifecycle.serve(engine)
        with pytest.raises(asyncio.CancelledError):
            await _drive_like_grpc_aio(servicer.Generate, request, context)
        # at once, on the running loop (asyncio.run would close a left-over generator on its way out):
        # the engine was told, the RPC no longer counts, the span is closed
        assert aborted == ["leaves"] and lifecycle.num_in_flight == 0
        finished = spans.get_finished_spans()
        assert [s.attributes["rpc.grpc.status_code"] for s in finished if s.attributes] == ["CANCELLED"]

    asyncio.run(main())
    deadline_s = time.monotonic() + 10
    while engine.core.is_in_flight("leaves") and time.monotonic() < deadline_s:
        time.sleep(0.02)
    assert not engine.core.is_in_flight("leaves") and len(context.writes) == 1
    engine.core.block_manager.assert_no_leaks()
    telemetry.shutdown()
