"""Fixtures: a fake gRPC upstream and a gateway in front of it, both on one event-loop thread, per test module."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.unit.server.gateway.gateway_helpers import (
    FakeInference,
    FakeUpstream,
    LoopThread,
    RunningGateway,
    running_gateway,
)


@pytest.fixture(scope="module")
def upstream(loop: LoopThread) -> Iterator[FakeUpstream]:
    fake = FakeUpstream()
    loop.call(fake.start())
    yield fake
    loop.call(fake.stop())


@pytest.fixture(scope="module")
def gateway(upstream: FakeUpstream, loop: LoopThread) -> Iterator[RunningGateway]:
    with running_gateway(upstream.address, loop, metrics_port=0) as gateway:
        yield gateway


@pytest.fixture
def http(gateway: RunningGateway) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, timeout=30) as client:
        yield client


@pytest.fixture
def fake(upstream: FakeUpstream) -> FakeInference:
    upstream.servicer.requests.clear()
    upstream.servicer.metadata.clear()
    return upstream.servicer
