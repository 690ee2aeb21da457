"""Fixtures shared by the server's unit tests (the gateway's and the security tests)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.unit.server.gateway.gateway_helpers import LoopThread
from tests.unit.server.security_helpers import Certs, make_certs


@pytest.fixture(scope="module")
def loop() -> Iterator[LoopThread]:
    """An event loop on its own thread, per test module: servers run there, tests call into it."""
    loop = LoopThread()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """A test CA, a server certificate for localhost, a client certificate and an unrelated CA."""
    return make_certs(tmp_path_factory.mktemp("certs"))
