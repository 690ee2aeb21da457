"""A plaintext drain keeps its port answering: a client that connects after the GOAWAY (grpc closes its listener
then) is told UNAVAILABLE with the contract's NOT_SERVING reason and a retry hint, and health says NOT_SERVING,
until the streams in flight have finished and the server stops (issue 38: such connections were reset)."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from infer.api import ERROR_REASON_KEY, RETRY_AFTER_KEY, SERVICE_NAME, pb, pb_grpc
from infer.clients import AsyncInferClient, Sampling
from infer.engine.async_engine import AsyncEngine
from infer.server.app import GOAWAY_DELAY_S, InferenceServer
from infer.server.lifecycle import RETRY_AFTER_S
from infer.server.settings import ServerConfig
from tests.helpers.fake_engine import fake_core
from tests.unit.server.gateway.gateway_helpers import LoopThread

NUM_TOKENS = 50


async def _a_new_connection_mid_drain(server: InferenceServer) -> tuple[grpc.RpcError, str, int]:
    """A stream in flight, the drain started: a fresh channel's call and health check, past the GOAWAY."""
    client = AsyncInferClient(f"127.0.0.1:{server.port}")
    stream = client.generate("Hello", Sampling(max_tokens=NUM_TOKENS, temperature=0, ignore_eos=True))
    await anext(stream)
    stop = asyncio.ensure_future(server.stop(grace_s=30))
    await asyncio.sleep(GOAWAY_DELAY_S + 0.25)  # the GOAWAY is out and grpc's listener closed
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:  # NOTE: no retries: one answer
        with pytest.raises(grpc.RpcError) as refused:
            await pb_grpc.InferenceServiceStub(channel).GetModelInfo(pb.GetModelInfoRequest(), timeout=5)
        checked = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=5
        )
    num_tokens = 1 + sum([len(chunk.token_ids) async for chunk in stream])  # the stream in flight finishes
    await stop
    await client.close()
    return refused.value, health_pb2.HealthCheckResponse.ServingStatus.Name(checked.status), num_tokens


def test_a_client_connecting_mid_drain_is_told_unavailable_with_a_retry_hint(loop: LoopThread) -> None:
    core, runner = fake_core()
    runner.step_s = 0.03  # a 50-token stream: ~1.5 s, still running past the GOAWAY
    server = InferenceServer(ServerConfig(engine=core.config, grpc_port=0, http_port=None, metrics_port=None))
    loop.call(server.start())
    loop.call(server.load(AsyncEngine(core)))
    error, health, num_tokens = loop.call(_a_new_connection_mid_drain(server), timeout_s=30)
    metadata = dict(error.trailing_metadata() or ())
    assert error.code() is grpc.StatusCode.UNAVAILABLE, error
    assert metadata[ERROR_REASON_KEY] == "NOT_SERVING" and metadata[RETRY_AFTER_KEY] == str(RETRY_AFTER_S)
    assert health == "NOT_SERVING" and num_tokens == NUM_TOKENS
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:  # the drain is over: the port is closed
        start = time.monotonic()
        with pytest.raises(grpc.RpcError) as after:
            pb_grpc.InferenceServiceStub(channel).GetModelInfo(pb.GetModelInfoRequest(), timeout=5)
    assert after.value.code() is grpc.StatusCode.UNAVAILABLE and time.monotonic() - start < 5
    assert not dict(after.value.trailing_metadata() or ())  # grpc's own "cannot connect": nothing listens
