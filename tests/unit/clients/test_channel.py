"""The clients' channels: retries of UNAVAILABLE, round robin, and health checking over several servers."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from infer.api import SERVICE_NAME, pb, pb_grpc
from infer.clients import AsyncInferClient, InferClient, InferError
from infer.clients.channel import ChannelPool


class Replica(pb_grpc.InferenceServiceServicer):
    """A model server's front: Tokenize, and health; `loading` refuses as a server that is not ready does."""

    def __init__(self) -> None:
        self.num_calls = 0
        self.loading = False
        self.num_refused = 0
        self.fail_midway = False
        self.health = health.HealthServicer()
        self.health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)

    def set_loading(self) -> None:
        self.loading = True
        self.health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.NOT_SERVING)
        self.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)

    def Tokenize(self, request: pb.TokenizeRequest, context: Any) -> pb.TokenizeResponse:  # noqa: N802
        self.num_calls += 1
        if self.loading:
            context.abort(grpc.StatusCode.UNAVAILABLE, "not serving: the model is loading")
        return pb.TokenizeResponse(token_ids=[7])

    def Generate(self, request: pb.GenerateRequest, context: Any) -> Iterator[pb.GenerateResponse]:  # noqa: N802
        """Refuses its first `num_refused` calls; then two chunks, or one and UNAVAILABLE when `fail_midway`."""
        self.num_calls += 1
        if self.num_calls <= self.num_refused:
            context.abort(grpc.StatusCode.UNAVAILABLE, "not serving: the model is loading")
        yield pb.GenerateResponse(token_ids=[7], text="a")
        if self.fail_midway:
            context.abort(grpc.StatusCode.UNAVAILABLE, "the server is gone")
        yield pb.GenerateResponse(token_ids=[8], text="b", finish_reason=pb.FINISH_REASON_LENGTH)


@pytest.fixture
def replicas() -> Iterator[list[tuple[str, Replica]]]:
    running = []
    for _ in range(2):
        replica, server = Replica(), grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_InferenceServiceServicer_to_server(replica, server)
        health_pb2_grpc.add_HealthServicer_to_server(replica.health, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        running.append((f"127.0.0.1:{port}", replica, server))
    yield [(address, replica) for address, replica, _ in running]
    for _, _, server in running:
        server.stop(None)


def test_a_client_of_several_servers_skips_one_that_is_not_serving(replicas: list[tuple[str, Replica]]) -> None:
    (_, loading), (_, ready) = replicas
    loading.set_loading()
    with InferClient("ipv4:" + ",".join(address for address, _ in replicas), timeout_s=10) as client:
        assert all(client.tokenize("Hello") == [7] for _ in range(10))
    assert (loading.num_calls, ready.num_calls) == (0, 10)


def test_a_client_of_one_server_sees_why_it_is_not_serving(replicas: list[tuple[str, Replica]]) -> None:
    address, replica = replicas[0]
    replica.set_loading()
    with InferClient(address, timeout_s=10) as client:
        assert client.health() == "NOT_SERVING"
        with pytest.raises(InferError, match="the model is loading") as refused:
            client.tokenize("Hello")
    assert refused.value.code is grpc.StatusCode.UNAVAILABLE
    assert replica.num_calls == 5  # tried, then retried 4 times with backoff: it may have become ready


def test_a_stream_refused_before_its_first_chunk_is_retried(replicas: list[tuple[str, Replica]]) -> None:
    address, replica = replicas[0]
    replica.num_refused = 2
    with InferClient(address, timeout_s=10) as client:
        assert client.complete("Hello").text == "ab"
    assert replica.num_calls == 3


def test_a_stream_that_fails_after_its_first_chunk_is_not_replayed(replicas: list[tuple[str, Replica]]) -> None:
    address, replica = replicas[0]
    replica.fail_midway = True
    with InferClient(address, timeout_s=10) as client, pytest.raises(InferError, match="the server is gone"):
        client.complete("Hello")
    assert replica.num_calls == 1


def test_the_async_client_retries_a_refused_stream_too(replicas: list[tuple[str, Replica]]) -> None:
    address, replica = replicas[0]
    replica.num_refused = 2

    async def complete() -> str:
        async with AsyncInferClient(address, timeout_s=10) as client:
            return (await client.complete("Hello")).text

    assert asyncio.run(complete()) == "ab"
    assert replica.num_calls == 3  # by the channel's retry policy


def test_a_pool_opens_a_channel_when_the_open_ones_carry_their_cap_and_keeps_one_idle() -> None:
    async def scenario() -> tuple[list[int], list[int], int]:
        pool = ChannelPool("127.0.0.1:1", max_calls=2)
        lanes = [pool.acquire() for _ in range(5)]
        opened = [lane.num_calls for lane in pool.lanes]
        for lane in lanes:
            pool.release(lane)
        idle = [lane.num_calls for lane in pool.lanes]
        await pool.close()
        return opened, idle, len(pool.lanes)

    opened, idle, left = asyncio.run(scenario())
    assert opened == [2, 2, 1]  # the first channels filled to the cap, then a new one
    assert idle == [0] and left == 0  # idle channels closed but one; close() closes that one too
    with pytest.raises(ValueError, match="max_streams_per_channel"):
        ChannelPool("127.0.0.1:1", max_calls=0)
    assert ChannelPool("dns:///infer:50051", max_calls=100).max_calls == 99  # one stream is health's Watch
