"""Fixtures: the default-model gRPC server shared by the integration modules, and a stub on it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from infer.api import pb_grpc
from tests.integration.grpc_helpers import ServerThread, running_server


@pytest.fixture(scope="session")
def grpc_server(default_model_dir: Path) -> Iterator[ServerThread]:
    """The default-model server shared by the integration modules (default engine limits)."""
    with running_server(default_model_dir) as server:
        yield server


@pytest.fixture
def stub(grpc_server: ServerThread) -> Iterator[pb_grpc.InferenceServiceStub]:
    with grpc.insecure_channel(grpc_server.address) as channel:
        yield pb_grpc.InferenceServiceStub(channel)
