"""The plaintext health-only port (`health_port`): the main server's grpc.health.v1 status, in step with it,
while the main port speaks mTLS; nothing but health on it; closed once the server stops."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from infer.api import pb, pb_grpc
from infer.clients.channel import ClientTls, channel
from infer.engine.async_engine import AsyncEngine
from infer.server.app import InferenceServer
from infer.server.cli import main
from infer.server.settings import ServerConfig
from tests.helpers.fake_engine import fake_core
from tests.unit.server.gateway.gateway_helpers import LoopThread
from tests.unit.server.security_helpers import Certs

SERVING, NOT_SERVING = "SERVING", "NOT_SERVING"


@dataclass
class TwoPorts:
    server: InferenceServer
    mtls: ClientTls

    @property
    def main(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    @property
    def health(self) -> str:
        assert self.server.health_port is not None
        return f"127.0.0.1:{self.server.health_port.port}"


def _status(address: str, tls: ClientTls | None = None, service: str = "") -> str:
    with channel(address, tls) as ch:
        response = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))


def _both(ports: TwoPorts, service: str = "") -> tuple[str, str]:
    return _status(ports.main, ports.mtls, service), _status(ports.health, service=service)


@pytest.fixture
def ports(loop: LoopThread, certs: Certs) -> Iterator[TwoPorts]:
    """A started server (loading: no engine yet) with mTLS on its main port and a plaintext health port."""
    core, _ = fake_core()
    config = ServerConfig(
        engine=core.config, grpc_port=0, http_port=None, metrics_port=None, health_port=0, warmup=False,
        tls_cert=certs.server_cert, tls_key=certs.server_key, tls_client_ca=certs.ca,
    )  # fmt: skip
    server = InferenceServer(config)
    loop.call(server.start())
    try:
        yield TwoPorts(server, ClientTls(certs.ca, certs.client_cert, certs.client_key))
    finally:
        loop.call(server.stop(grace_s=0))


def _load(ports: TwoPorts, loop: LoopThread) -> None:
    core, _ = fake_core()
    loop.call(ports.server.load(AsyncEngine(core)))


def test_the_health_port_follows_loading_serving_and_draining(ports: TwoPorts, loop: LoopThread) -> None:
    assert _both(ports) == (NOT_SERVING, NOT_SERVING)  # loading
    _load(ports, loop)
    assert _both(ports) == (SERVING, SERVING)
    assert _both(ports, "infer.v1.InferenceService") == (SERVING, SERVING)
    loop.call(ports.server.lifecycle.start_draining())  # what SIGTERM starts with
    assert _both(ports) == (NOT_SERVING, NOT_SERVING)


def test_a_watch_on_the_health_port_sees_each_change(ports: TwoPorts, loop: LoopThread) -> None:
    seen: queue.Queue[str] = queue.Queue()
    ch = channel(ports.health)
    watch = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(), timeout=30)

    def read() -> None:
        try:
            for response in watch:
                seen.put(str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)))
        except grpc.RpcError:
            pass

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert seen.get(timeout=10) == NOT_SERVING
        _load(ports, loop)
        assert seen.get(timeout=10) == SERVING
        loop.call(ports.server.lifecycle.start_draining())
        assert seen.get(timeout=10) == NOT_SERVING
    finally:
        watch.cancel()
        ch.close()
        reader.join(10)


def test_the_health_port_serves_health_and_nothing_else(ports: TwoPorts, loop: LoopThread) -> None:
    _load(ports, loop)
    with channel(ports.health) as ch:
        with pytest.raises(grpc.RpcError) as e:
            pb_grpc.InferenceServiceStub(ch).GetModelInfo(pb.GetModelInfoRequest(), timeout=10)  # type: ignore[no-untyped-call]
        assert e.value.code() is grpc.StatusCode.UNIMPLEMENTED
    with channel(ports.main, ports.mtls) as ch:  # the main port still serves, over mTLS
        info = pb_grpc.InferenceServiceStub(ch).GetModelInfo(pb.GetModelInfoRequest(), timeout=10)  # type: ignore[no-untyped-call]
        assert info.model_id == "fake"
    with pytest.raises(grpc.RpcError) as e:
        _status(ports.main)  # plaintext to the main port: what a kubelet probe would get there
    assert e.value.code() is grpc.StatusCode.UNAVAILABLE


def test_infer_health_checks_either_port(ports: TwoPorts, loop: LoopThread, certs: Certs) -> None:
    _load(ports, loop)
    assert main(["health", "--address", ports.health]) == 0
    mtls = ["--tls-ca", certs.ca, "--tls-cert", certs.client_cert, "--tls-key", certs.client_key]
    assert main(["health", "--address", ports.main, *mtls]) == 0
    assert main(["health", "--address", ports.main, "--timeout-s", "5"]) == 1


def test_the_health_port_closes_when_the_server_stops(loop: LoopThread, certs: Certs) -> None:
    core, _ = fake_core()
    config = ServerConfig(engine=core.config, grpc_port=0, http_port=None, metrics_port=None, health_port=0)
    server = InferenceServer(config)
    loop.call(server.start())
    loop.call(server.load(AsyncEngine(core)))
    assert server.health_port is not None
    address = f"127.0.0.1:{server.health_port.port}"
    assert _status(address) == SERVING
    loop.call(server.stop(grace_s=0))
    with pytest.raises(grpc.RpcError) as e:
        _status(address)
    assert e.value.code() is grpc.StatusCode.UNAVAILABLE


def test_a_busy_health_port_stops_the_start(loop: LoopThread) -> None:
    core, _ = fake_core()
    first = InferenceServer(ServerConfig(engine=core.config, grpc_port=0, http_port=None, metrics_port=None))
    loop.call(first.start())
    try:
        config = ServerConfig(
            engine=core.config, grpc_port=0, http_port=None, metrics_port=None, health_port=first.port
        )
        with pytest.raises(OSError, match="health_port: cannot listen"):
            loop.call(InferenceServer(config).start())
    finally:
        loop.call(first.stop(grace_s=0))


def test_health_port_settings() -> None:
    assert ServerConfig().health_port is None  # off unless asked for
    with pytest.raises(ValueError, match="health_port: must not be grpc_port"):
        ServerConfig(grpc_port=50051, health_port=50051)
    with pytest.raises(ValueError, match="health_port"):
        ServerConfig(health_port=70000)
