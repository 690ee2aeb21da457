"""The gateway's upstream channel balances requests over every address its target resolves to."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from infer.clients.proto.v1 import inference_pb2 as pb
from infer.clients.proto.v1 import inference_pb2_grpc as pb_grpc
from infer.server.gateway.upstream import Upstream


class CountingTokenizer(pb_grpc.InferenceServiceServicer):
    def __init__(self) -> None:
        self.num_calls = 0

    def Tokenize(self, request: pb.TokenizeRequest, context: Any) -> pb.TokenizeResponse:  # noqa: N802
        self.num_calls += 1
        return pb.TokenizeResponse(token_ids=[1, 2])


@pytest.fixture
def two_servers() -> Iterator[tuple[list[int], list[CountingTokenizer]]]:
    ports, servicers, servers = [], [], []
    for _ in range(2):
        servicer = CountingTokenizer()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pb_grpc.add_InferenceServiceServicer_to_server(servicer, server)
        ports.append(server.add_insecure_port("127.0.0.1:0"))
        server.start()
        servicers.append(servicer)
        servers.append(server)
    yield ports, servicers
    for server in servers:
        server.stop(None)


def test_requests_are_spread_over_all_resolved_addresses(
    two_servers: tuple[list[int], list[CountingTokenizer]],
) -> None:
    """What a headless Service gives the separate gateway: one name, one address per model server pod."""
    ports, servicers = two_servers
    target = "ipv4:" + ",".join(f"127.0.0.1:{port}" for port in ports)
    messages = pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="Hi")])

    async def call_20_times() -> None:
        upstream = Upstream(target, timeout_s=10)
        try:
            for _ in range(20):
                assert await upstream.num_prompt_tokens(messages) == 2
        finally:
            await upstream.close()

    asyncio.run(call_20_times())
    counts = [s.num_calls for s in servicers]
    assert sum(counts) == 20 and min(counts) > 0, counts  # pick-first would send all 20 to one server
