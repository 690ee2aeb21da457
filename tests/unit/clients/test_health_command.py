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
from infer.server.security import TlsFiles, server_credentials
from tests.unit.server.security_helpers import Certs, make_certs

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


# TLS: `infer health` as an exec probe or a person checks a server whose gRPC port speaks (m)TLS


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture
def mtls_server(certs: Certs) -> Iterator[str]:
    servicer = health.HealthServicer()
    servicer.set("", SERVING)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_secure_port(
        "127.0.0.1:0", server_credentials(TlsFiles(certs.server_cert, certs.server_key, certs.ca))
    )
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None)


def test_tls_flags_reach_a_tls_server(mtls_server: str, certs: Certs, capsys: pytest.CaptureFixture[str]) -> None:
    client = ["--tls-cert", certs.client_cert, "--tls-key", certs.client_key]
    assert main(["health", "--address", mtls_server, "--tls-ca", certs.ca, *client]) == 0
    assert capsys.readouterr().out == f"{mtls_server}: SERVING\n"
    # --tls-server-name: the name to check in the certificate (it names localhost and 127.0.0.1)
    named = ["health", "--address", mtls_server, "--tls-ca", certs.ca, *client, "--timeout-s", "5", "--tls-server-name"]
    assert main([*named, "localhost"]) == 0
    assert main([*named, "infer.example.com"]) == 1


def test_without_tls_flags_a_tls_server_fails_with_a_hint(
    mtls_server: str, certs: Certs, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["health", "--address", mtls_server, "--timeout-s", "5"]) == 1
    assert "UNAVAILABLE" in (err := capsys.readouterr().err) and "a TLS server? pass --tls-ca" in err
    assert main(["health", "--address", mtls_server, "--tls-ca", certs.ca, "--timeout-s", "5"]) == 1
    assert "an mTLS server? pass --tls-cert and --tls-key" in capsys.readouterr().err
    other_ca = ["--tls-ca", certs.other_ca, "--tls-cert", certs.client_cert, "--tls-key", certs.client_key]
    assert main(["health", "--address", mtls_server, *other_ca, "--timeout-s", "5"]) == 1  # a CA that did not sign it


def test_bad_tls_flags_exit_1_with_the_reason(
    mtls_server: str, certs: Certs, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["health", "--address", mtls_server, "--tls-ca", "/no/such/ca.pem"]) == 1
    assert "tls ca_file: cannot read /no/such/ca.pem" in capsys.readouterr().err
    assert main(["health", "--address", mtls_server, "--tls-cert", certs.client_cert]) == 1
    assert "give both, or neither" in capsys.readouterr().err


def test_default_address_prefers_the_plaintext_health_port() -> None:
    environ = {"INFER_GRPC_PORT": "6000", "INFER_HEALTH_PORT": "6001"}
    assert health_address(environ) == "127.0.0.1:6001"
    assert health_address(environ | {"INFER_HEALTH_PORT": "off"}) == "127.0.0.1:6000"
