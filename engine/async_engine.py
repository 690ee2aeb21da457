"""AsyncEngine: the engine core on its own thread, streamed to asyncio callers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import uuid
from collections.abc import AsyncIterator, Sequence

from infer.engine.config import EngineConfig
from infer.engine.core import EngineCore
from infer.engine.request import RequestOutput
from infer.engine.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class AsyncEngine:
    """`async for delta in engine.generate(...)`; the step loop never runs on the event loop."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="infer-engine-core", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, config: EngineConfig) -> AsyncEngine:
        return cls(EngineCore(config))

    @property
    def tokenizer(self):  # type: ignore[no-untyped-def]
        return self.core.tokenizer

    def _run(self) -> None:
        core = self.core
        while not self._stopped.is_set():
            try:
                did_work = core.step()
            except Exception:
                logger.exception("engine step failed; failing its requests")
                for rid in list(core.live):
                    core._fail(rid, RuntimeError("engine step failed"))
                did_work = False
            if not did_work:
                # static batching waits for its batch to fill: poll while requests wait
                timeout = self.core.config.static_batch_wait_s / 2 if core.scheduler.waiting else None
                core.wakeup.wait(timeout)
                core.wakeup.clear()

    def encode(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            return self.core.tokenizer.encode(prompt)
        return list(prompt)

    async def generate(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams,
        request_id: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Stream deltas; ValueError for bad input, QueueFullError when the queue is full.

        Leaving the loop early (or cancellation) aborts the request in the engine.
        """
        request_id = request_id or uuid.uuid4().hex
        loop = asyncio.get_running_loop()
        deltas: asyncio.Queue[RequestOutput] = asyncio.Queue()

        def sink(out: RequestOutput) -> None:
            with contextlib.suppress(RuntimeError):  # a closed loop: its caller is gone
                loop.call_soon_threadsafe(deltas.put_nowait, out)

        self.core.add_request(request_id, self.encode(prompt), params, sink)
        finished = False
        try:
            while not finished:
                out = await deltas.get()
                finished = out.finished
                yield out
        finally:
            if not finished:
                self.core.abort(request_id)

    def abort(self, request_id: str) -> None:
        self.core.abort(request_id)

    def shutdown(self) -> None:
        self._stopped.set()
        self.core.wakeup.set()
        self._thread.join(timeout=10)
