"""The server's start: health says SERVING only once the model is loaded and a warm-up request succeeded."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import weakref
from collections.abc import Callable
from dataclasses import replace

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from infer.api import pb, pb_grpc
from infer.engine import EngineConfig
from infer.engine.async_engine import AsyncEngine, WarmupError
from infer.server import app
from infer.server.app import InferenceServer, grpc_options, on_available_device, serve
from infer.server.settings import ServerConfig
from tests.helpers.fake_engine import FakeRunner, fake_core


def _poison_the_warmup(runner: FakeRunner) -> None:
    runner.poison = set(runner.text_ids[:1])  # the warm-up prompt is "Hello" repeated: TEXT's first token


def _fail_on_the_third_forward_pass(runner: FakeRunner) -> None:
    runner.num_good_calls = 2  # a prefill and one decode step pass; a kernel fails on a later call


def _failing_engine(breaks: Callable[[FakeRunner], None]) -> AsyncEngine:
    core, runner = fake_core()
    breaks(runner)
    return AsyncEngine(core)


def _config() -> ServerConfig:
    return ServerConfig(engine=fake_core()[0].config, grpc_port=0, metrics_port=None, http_port=None)


@pytest.mark.parametrize("breaks", [_poison_the_warmup, _fail_on_the_third_forward_pass])
def test_a_failed_warmup_keeps_health_not_serving(breaks: Callable[[FakeRunner], None]) -> None:
    async def main() -> None:
        server = InferenceServer(_config())
        await server.start()
        engine = _failing_engine(breaks)
        try:
            with pytest.raises(WarmupError, match="failed"):
                await server.load(engine)
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
                assert health.status == health_pb2.HealthCheckResponse.NOT_SERVING
                stub = pb_grpc.InferenceServiceStub(channel)  # type: ignore[no-untyped-call]
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
                assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
            assert not engine._thread.is_alive()  # its engine thread was stopped, not left running
        finally:
            await server.stop(grace_s=0)

    asyncio.run(main())


def test_serve_exits_1_when_the_warmup_fails(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(app.AsyncEngine, "from_config", lambda config: _failing_engine(_poison_the_warmup))
    assert asyncio.run(asyncio.wait_for(serve(_config()), timeout=60)) == 1  # not serving until a signal
    assert "model failed to load or warm up: the warm-up request failed" in caplog.text
    assert "SERVING on" not in caplog.text


def test_a_warmup_that_succeeds_serves() -> None:
    async def main() -> None:
        server = InferenceServer(_config())
        await server.start()
        try:
            await server.load(_failing_engine(lambda runner: None))
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
                assert health.status == health_pb2.HealthCheckResponse.SERVING
        finally:
            await server.stop(grace_s=0)

    asyncio.run(main())


def test_connection_age_settings_become_grpc_channel_args() -> None:
    options = dict(grpc_options(ServerConfig(max_connection_age_s=1.5, max_connection_age_grace_s=0)))
    assert options["grpc.max_connection_age_ms"] == 1500 and options["grpc.max_connection_age_grace_ms"] == 0
    options = dict(grpc_options(ServerConfig(max_connection_age_s=None, max_connection_age_grace_s=None)))
    assert "grpc.max_connection_age_ms" not in options and "grpc.max_connection_age_grace_ms" not in options


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_serve_turns_the_collector_back_on_once_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    """`infer serve` starts with the collector paused (cli.main); shortly after SERVING it is back on: the
    start-up's garbage collected, everything alive then (modules, model, tokenizer) frozen out of its passes."""
    monkeypatch.setattr(app.AsyncEngine, "from_config", lambda config: _failing_engine(lambda runner: None))
    load, seen = InferenceServer.load, []

    async def load_then_stop(server: InferenceServer) -> None:
        await load(server)

        def check_then_stop() -> None:  # after the collection serve schedules once SERVING
            seen.append((gc.isenabled(), gc.get_freeze_count() > 0, garbage() is None))
            os.kill(os.getpid(), signal.SIGTERM)

        asyncio.get_running_loop().call_later(0.2, check_then_stop)

    monkeypatch.setattr(InferenceServer, "load", load_then_stop)
    monkeypatch.setattr(app, "COLLECT_AFTER_SERVING_S", 0.05)
    gc.disable()
    garbage = weakref.ref(_Cycle())  # a cycle of the start-up, unreachable
    try:
        assert asyncio.run(asyncio.wait_for(serve(_config()), timeout=60)) == 0
    finally:
        gc.enable()
        gc.unfreeze()
    assert seen == [(True, True, True)]


def test_a_cuda_device_that_torch_does_not_see_loads_the_engine_on_the_cpu(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The CUDA image sets INFER_DEVICE=cuda: on a machine without a GPU it serves on the CPU and says why."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    loaded: list[EngineConfig] = []

    def from_config(config: EngineConfig) -> AsyncEngine:
        loaded.append(config)
        return _failing_engine(lambda runner: None)

    monkeypatch.setattr(app.AsyncEngine, "from_config", from_config)

    async def main() -> None:
        config = _config()
        server = InferenceServer(replace(config, engine=replace(config.engine, device="cuda")))
        await server.start()
        try:
            await server.load()
        finally:
            await server.stop(grace_s=0)

    asyncio.run(main())
    assert [config.device for config in loaded] == ["cpu"]
    assert "device cuda asked for, but " in caplog.text and ": serving on the CPU" in caplog.text


@pytest.mark.parametrize(("device", "cuda_seen"), [("cpu", False), ("cpu", True), ("cuda", True), ("cuda:1", True)])
def test_a_device_torch_can_use_is_kept(monkeypatch: pytest.MonkeyPatch, device: str, cuda_seen: bool) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda_seen)
    config = EngineConfig(device=device)
    assert on_available_device(config) is config


def test_cuda_1_without_a_cuda_device_is_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert on_available_device(EngineConfig(device="cuda:1")).device == "cpu"
