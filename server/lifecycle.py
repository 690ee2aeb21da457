"""Serving state: loading -> serving -> draining -> stopped, mirrored in grpc.health.v1.

RPCs enter through `in_flight()`: refused unless serving, counted while they run, so a drain
(`start_draining`, then `wait_idle`) can wait for the in-flight ones to finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Iterator

from grpc_health.v1 import health, health_pb2

from infer.api import SERVICE_NAME
from infer.engine import EngineClient

logger = logging.getLogger(__name__)


class State(enum.Enum):
    LOADING = "loading"
    SERVING = "serving"
    DRAINING = "draining"
    STOPPED = "stopped"


SHUTTING_DOWN = "the server is shutting down"
RETRY_AFTER_S = 2  # the retry hint of a refusal while not serving (RETRY_AFTER_KEY; the gateway's 503 Retry-After)


class NotServingError(RuntimeError):
    """The server is loading its model or draining: UNAVAILABLE, try another replica (or again in RETRY_AFTER_S)."""


class Lifecycle:
    def __init__(self) -> None:
        self.state = State.LOADING
        self.health = health.aio.HealthServicer()
        self.engine: EngineClient | None = None
        self.num_in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    async def start(self) -> None:
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)

    async def serve(self, engine: EngineClient) -> None:
        """The model is loaded and warm: accept RPCs."""
        self.engine, self.state = engine, State.SERVING
        await self._set_health(health_pb2.HealthCheckResponse.SERVING)

    async def watch_engine(self, stall_timeout_s: float, interval_s: float = 1.0) -> None:
        """Until cancelled: health NOT_SERVING while the engine makes no progress, SERVING again once it does
        (probes then take the replica out of rotation, or restart it if it never recovers)."""
        stalled: str | None = None
        while True:
            await asyncio.sleep(interval_s)
            if self.state is not State.SERVING or self.engine is None:
                continue
            problem = self.engine.problem(stall_timeout_s)
            if problem is not None and stalled is None:
                logger.error("health NOT_SERVING: %s", problem)
                await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
            elif problem is None and stalled is not None:
                logger.warning("health SERVING again: the engine makes progress")
                await self._set_health(health_pb2.HealthCheckResponse.SERVING)
            stalled = problem

    async def _set_health(self, status: int) -> None:
        for name in ("", SERVICE_NAME):
            await self.health.set(name, status)

    @contextlib.contextmanager
    def in_flight(self) -> Iterator[EngineClient]:
        """The engine for one RPC; NotServingError unless serving."""
        if self.state is not State.SERVING or self.engine is None:
            reason = "the model is loading" if self.state is State.LOADING else SHUTTING_DOWN
            raise NotServingError(f"not serving: {reason}")
        self.num_in_flight += 1
        self._idle.clear()
        try:
            yield self.engine
        finally:
            self.num_in_flight -= 1
            if self.num_in_flight == 0:
                self._idle.set()

    async def start_draining(self) -> None:
        """Health NOT_SERVING (for good), and new RPCs refused from now on."""
        if self.state is not State.STOPPED:
            self.state = State.DRAINING
        await self.health.enter_graceful_shutdown()
        logger.info("draining: %d RPCs in flight", self.num_in_flight)

    async def wait_idle(self, grace_s: float) -> bool:
        """Until the RPCs in flight have finished; False if some outlived grace_s."""
        if self.num_in_flight == 0:
            return True
        try:
            await asyncio.wait_for(self._idle.wait(), grace_s)
        except TimeoutError:
            logger.warning("drain: %d RPCs still in flight after %.1f s; cancelling them", self.num_in_flight, grace_s)
            return False
        return True

    def stopped(self) -> None:
        self.state = State.STOPPED
