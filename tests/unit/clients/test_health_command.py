"""`infer health` (the container probe) against an in-process grpc.health.v1 server: exit codes, waiting, address."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from infer.clients.cli import health_address
from infer.server.cli import main

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
HealthServer = tuple[str, health.HealthServicer]  # address, servicer


@pytest.fixture
def health_server() -> Iterator[HealthServer]:
    servicer = health.HealthServicer()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        server.stop(None)


def test_serving_exits_0(health_server: HealthServer, capsys: pytest.CaptureFixture[str]) -> None:
    address, servicer = health_server
    servicer.set("", SERVING)
    assert main(["health", "--address", address]) == 0
    assert capsys.readouterr().out == f"{address}: SERVING\n"


def test_not_serving_exits_1(health_server: HealthServer, capsys: pytest.CaptureFixture[str]) -> None:
    address, servicer = health_server
    servicer.set("", NOT_SERVING)
    assert main(["health", "--address", address]) == 1
    assert capsys.readouterr().err == f"{address}: NOT_SERVING\n"


def test_checks_the_named_service(health_server: HealthServer) -> None:
    address, servicer = health_server
    servicer.set("", SERVING)
    servicer.set("infer.v1.InferenceService", NOT_SERVING)
    assert main(["health", "--address", address, "--service", "infer.v1.InferenceService"]) == 1
    assert main(["health", "--address", address, "--service", "no.such.Service"]) == 1


def test_nothing_listening_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:  # a port that was free a moment ago, closed again
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert main(["health", "--address", f"127.0.0.1:{port}", "--timeout-s", "2"]) == 1
    assert "UNAVAILABLE" in capsys.readouterr().err


def test_wait_s_waits_until_serving(health_server: HealthServer) -> None:
    address, servicer = health_server
    servicer.set("", NOT_SERVING)
    timer = threading.Timer(0.3, servicer.set, ("", SERVING))
    timer.start()
    try:
        assert main(["health", "--address", address, "--wait-s", "10"]) == 0
    finally:
        timer.cancel()


def test_default_address_follows_the_server_port() -> None:
    assert health_address({}) == "127.0.0.1:50051"
    assert health_address({"INFER_GRPC_PORT": "6000"}) == "127.0.0.1:6000"
    assert health_address({"INFER_GRPC_PORT": "6000", "INFER_ADDRESS": "svc:7000"}) == "svc:7000"


def test_probe_process_stays_light(health_server: HealthServer) -> None:
    """The Dockerfile's HEALTHCHECK runs it every interval: no torch, no engine."""
    address, servicer = health_server
    servicer.set("", SERVING)
    code = (
        "import sys\n"
        "from infer.server.cli import main\n"
        "assert main(['health']) == 0\n"
        "assert 'torch' not in sys.modules and 'infer.engine' not in sys.modules, 'engine imported'\n"
    )
    port = address.rsplit(":", 1)[1]
    env = {"INFER_GRPC_PORT": port, "PATH": ""}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"127.0.0.1:{port}: SERVING\n"
