"""The gateway's upstream channel balances requests over every address its target resolves to, and moves them off
a model server that drains (health NOT_SERVING) or refuses them (UNAVAILABLE)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from infer.api import SERVICE_NAME, pb, pb_grpc
from infer.server.gateway.upstream import Upstream


class CountingServer(pb_grpc.InferenceServiceServicer):
    def __init__(self) -> None:
        self.num_calls = 0
        self.refuse = False  # answer UNAVAILABLE, as a server that is loading or draining does
        self.health = health.HealthServicer()
        self.health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)

    def Generate(self, request: pb.GenerateRequest, context: Any) -> Iterator[pb.GenerateResponse]:  # noqa: N802
        self.num_calls += 1
        if self.refuse:
            context.abort(grpc.StatusCode.UNAVAILABLE, "not serving: the server is shutting down")
        yield pb.GenerateResponse(token_ids=[1, 2], finish_reason=pb.FINISH_REASON_LENGTH)


@pytest.fixture
def two_servers() -> Iterator[tuple[list[int], list[CountingServer]]]:
    ports, servicers, servers = [], [], []
    for _ in range(2):
        servicer = CountingServer()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_InferenceServiceServicer_to_server(servicer, server)
        health_pb2_grpc.add_HealthServicer_to_server(servicer.health, server)
        ports.append(server.add_insecure_port("127.0.0.1:0"))
        server.start()
        servicers.append(servicer)
        servers.append(server)
    yield ports, servicers
    for server in servers:
        server.stop(None)


def test_requests_are_spread_over_all_resolved_addresses(
    two_servers: tuple[list[int], list[CountingServer]],
) -> None:
    """What a headless Service gives the separate gateway: one name, one address per model server pod."""
    ports, servicers = two_servers
    target = "ipv4:" + ",".join(f"127.0.0.1:{port}" for port in ports)

    asyncio.run(_call_20_times(target))
    counts = [s.num_calls for s in servicers]
    assert sum(counts) == 20 and min(counts) > 0, counts  # pick-first would send all 20 to one server


def test_a_draining_server_gets_no_request(two_servers: tuple[list[int], list[CountingServer]]) -> None:
    ports, (draining, other) = two_servers
    draining.health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.NOT_SERVING)
    draining.refuse = True
    asyncio.run(_call_20_times("ipv4:" + ",".join(f"127.0.0.1:{port}" for port in ports)))
    assert (draining.num_calls, other.num_calls) == (0, 20)  # its health watch keeps it out of the rotation


def test_a_request_refused_unavailable_is_retried_on_another_server(
    two_servers: tuple[list[int], list[CountingServer]],
) -> None:
    """A server still healthy a moment ago (its health watch not yet seen) that refuses: the call moves on."""
    ports, (refusing, other) = two_servers
    refusing.refuse = True
    asyncio.run(_call_20_times("ipv4:" + ",".join(f"127.0.0.1:{port}" for port in ports)))
    assert other.num_calls == 20 and refusing.num_calls > 0


async def _call_20_times(target: str) -> None:
    """20 Generate calls through the gateway's upstream; each one must succeed."""
    upstream = Upstream(target, timeout_s=10)
    try:
        for _ in range(20):
            responses = [r async for r in upstream.generate(pb.GenerateRequest(prompt="Hi"))]
            assert [list(r.token_ids) for r in responses] == [[1, 2]]
    finally:
        await upstream.close()
