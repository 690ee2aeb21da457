"""Hypothesis profiles: `ci` (the default: a short run in make test) and `fuzz` (make fuzz: a long one)."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import httpx
import pytest
from hypothesis import HealthCheck, settings

from infer.api import pb_grpc
from tests.integration.grpc_helpers import ServerThread
from tests.unit.server.gateway.gateway_helpers import gateway_client

_COMMON = {"deadline": None, "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]}
settings.register_profile("ci", max_examples=60, **_COMMON)  # type: ignore[arg-type]
settings.register_profile("fuzz", max_examples=3000, **_COMMON)  # type: ignore[arg-type]
settings.load_profile("ci")


# the clients of a module's own `server` fixture (each module starts the fake server it needs)
@pytest.fixture(scope="module")
def stub(server: ServerThread) -> Iterator[pb_grpc.InferenceServiceStub]:
    """A gRPC stub on the module's server; it may send 8 MiB messages (the hostile inputs do)."""
    with grpc.insecure_channel(server.address, options=[("grpc.max_send_message_length", 8 << 20)]) as channel:
        yield pb_grpc.InferenceServiceStub(channel)  # type: ignore[no-untyped-call]


@pytest.fixture(scope="module")
def http(server: ServerThread) -> Iterator[httpx.Client]:
    """An HTTP client of a gateway over the module's server."""
    with gateway_client(server.address) as client:
        yield client
