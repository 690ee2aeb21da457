"""The OpenAI gateway in front of the default-model gRPC server, and the official client on it; for a module that
starts its own fake server (a fixture named `server`), a gateway client on that one and its engine held."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from infer.engine.core import EngineCore
from tests.helpers.fake_engine import FakeRunner
from tests.integration.grpc_helpers import ServerThread
from tests.unit.server.gateway.gateway_helpers import LoopThread, RunningGateway, gateway_client, running_gateway


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
def engine_idle_after(request: pytest.FixtureRequest) -> Iterator[None]:
    """After every test: no request left, no KV block leaked, on the module's own server if it has one."""
    yield
    server_fixture = "server" if hasattr(request.module, "server") else "grpc_server"
    server: ServerThread = request.getfixturevalue(server_fixture)
    server.wait_idle()


@pytest.fixture(scope="module")
def http(server: ServerThread) -> Iterator[httpx.Client]:
    """An HTTP client of a gateway over the module's own (fake) server."""
    with gateway_client(server.address) as client:
        yield client


@pytest.fixture
def stalled(server: ServerThread) -> Iterator[EngineCore]:
    """The module's fake engine with its forward pass held until the test ends."""
    core = server.engine.core
    runner = core.runner
    assert isinstance(runner, FakeRunner)
    runner.gate.clear()
    try:
        yield core
    finally:
        runner.gate.set()
