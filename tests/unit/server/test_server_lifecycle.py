"""Serving state: RPCs refused unless serving, drain waits for in-flight RPCs, health follows the state."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import cast

import pytest
from grpc_health.v1 import health_pb2

from infer.engine.async_engine import AsyncEngine
from infer.server.lifecycle import SERVICE_NAME, Lifecycle, NotServingError, State

ENGINE = cast(AsyncEngine, object())


async def _health(lifecycle: Lifecycle, service: str = "") -> int:
    class Context:
        async def abort(self, code: object, details: str) -> None:
            raise AssertionError(details)

    response = await lifecycle.health.Check(health_pb2.HealthCheckRequest(service=service), Context())
    return int(response.status)


def test_loading_refuses_rpcs_and_is_not_serving() -> None:
    async def main() -> None:
        lifecycle = Lifecycle()
        await lifecycle.start()
        assert await _health(lifecycle) == health_pb2.HealthCheckResponse.NOT_SERVING
        with pytest.raises(NotServingError, match="loading"), lifecycle.in_flight():
            pass
        await lifecycle.serve(ENGINE)
        for service in ("", SERVICE_NAME):
            assert await _health(lifecycle, service) == health_pb2.HealthCheckResponse.SERVING
        with lifecycle.in_flight() as engine:
            assert engine is ENGINE and lifecycle.num_in_flight == 1
        assert lifecycle.num_in_flight == 0

    asyncio.run(main())


def test_drain_waits_for_in_flight_rpcs_and_refuses_new_ones() -> None:
    async def main() -> None:
        lifecycle = Lifecycle()
        await lifecycle.serve(ENGINE)
        release = asyncio.Event()

        async def rpc() -> None:
            with lifecycle.in_flight():
                await release.wait()

        task = asyncio.create_task(rpc())
        await asyncio.sleep(0)
        await lifecycle.start_draining()
        drain = asyncio.create_task(lifecycle.wait_idle(grace_s=10))
        await asyncio.sleep(0.05)
        assert lifecycle.state is State.DRAINING and not drain.done()
        assert await _health(lifecycle) == health_pb2.HealthCheckResponse.NOT_SERVING
        with pytest.raises(NotServingError, match="shutting down"), lifecycle.in_flight():
            pass
        release.set()
        assert await drain is True
        await task

    asyncio.run(main())


def test_drain_gives_up_after_the_grace_period() -> None:
    async def main() -> bool:
        lifecycle = Lifecycle()
        await lifecycle.serve(ENGINE)
        with lifecycle.in_flight():
            await lifecycle.start_draining()
            return await lifecycle.wait_idle(grace_s=0.05)

    assert asyncio.run(main()) is False


@pytest.mark.parametrize("name", ["missing", "corrupt.gguf"])
def test_serve_exits_2_naming_a_model_it_cannot_load(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str
) -> None:
    from infer.engine import EngineConfig
    from infer.server.app import serve
    from infer.server.settings import ServerConfig

    (tmp_path / "corrupt.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(7))  # a header cut short
    config = ServerConfig(
        engine=EngineConfig(model=str(tmp_path / name)), grpc_port=0, metrics_port=None, http_port=None
    )
    assert asyncio.run(serve(config)) == 2
    assert "model failed to load" in caplog.text and name in caplog.text


def test_health_follows_an_engine_that_stalls_and_recovers() -> None:
    from infer.engine import AsyncEngine, SamplingParams
    from tests.helpers.fake_engine import fake_core

    core, runner = fake_core()
    engine = AsyncEngine(core)

    async def until_health(lifecycle: Lifecycle, status: int) -> None:
        for _ in range(500):
            if await _health(lifecycle) == status:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"health never became {status}")

    async def main() -> None:
        lifecycle = Lifecycle()
        await lifecycle.start()
        await lifecycle.serve(engine)
        watchdog = asyncio.create_task(lifecycle.watch_engine(stall_timeout_s=0.2, interval_s=0.02))
        runner.gate.clear()  # the next forward pass hangs
        async with engine.generate([5, 6], SamplingParams(max_tokens=4, ignore_eos=True)) as stream:
            await until_health(lifecycle, health_pb2.HealthCheckResponse.NOT_SERVING)
            runner.gate.set()  # it recovers
            assert len([d async for d in stream]) == 4
        await until_health(lifecycle, health_pb2.HealthCheckResponse.SERVING)
        watchdog.cancel()

    try:
        asyncio.run(main())
    finally:
        runner.gate.set()
        engine.shutdown()
    core.block_manager.assert_no_leaks()
