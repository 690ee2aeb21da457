"""The OpenAI gateway in front of the module's real gRPC server, and the official client on it."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.integration.grpc_helpers import ServerThread
from tests.unit.server.gateway.gateway_helpers import LoopThread, RunningGateway, running_gateway


@pytest.fixture(scope="module")
def gateway(grpc_server: ServerThread) -> Iterator[RunningGateway]:
    loop = LoopThread()
    try:
        with running_gateway(grpc_server.address, loop) as gateway:
            yield gateway
    finally:
        loop.close()


@pytest.fixture(scope="module")
def client(gateway: RunningGateway) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0) as client:
        yield client


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


@pytest.fixture(autouse=True)
def engine_idle_after(grpc_server: ServerThread) -> Iterator[None]:
    yield
    grpc_server.wait_idle()  # every test: no request left, no KV block leaked
