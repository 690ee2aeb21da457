"""The Prometheus port, bounded like the other doors: idle and slowloris clients closed, threads capped."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator

import httpx
from prometheus_client import CollectorRegistry, Counter

from infer.server.metrics_http import MetricsServer, start_metrics_server
from tests.unit.server.gateway.gateway_helpers import wait_for

READ_TIMEOUT_S = 10  # a bound on every socket read: the server must act long before


@contextlib.contextmanager
def _serving(header_timeout_s: float, max_connections: int = 16) -> Iterator[MetricsServer]:
    registry = CollectorRegistry()
    Counter("scrapes_seen", "a metric to find", registry=registry).inc()
    server = start_metrics_server(registry, "127.0.0.1", 0, header_timeout_s, max_connections)
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _connect(server: MetricsServer) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.server_port), timeout=READ_TIMEOUT_S)
    sock.settimeout(READ_TIMEOUT_S)
    return sock


def _read_until_closed(sock: socket.socket) -> bytes:
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            data += chunk
    return data


def _scrape(server: MetricsServer) -> str:
    return httpx.get(f"http://127.0.0.1:{server.server_port}/metrics", timeout=READ_TIMEOUT_S).text


def test_a_scrape_is_answered() -> None:
    with _serving(header_timeout_s=5) as server:
        assert "scrapes_seen_total 1.0" in _scrape(server)


def test_an_idle_connection_is_closed() -> None:
    with _serving(header_timeout_s=0.3) as server, _connect(server) as sock:
        assert _read_until_closed(sock) == b""  # NOTE: before, held until the client left


def test_a_slowloris_client_gets_408_and_is_closed() -> None:
    with _serving(header_timeout_s=0.5) as server, _connect(server) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\n")
        sock.settimeout(0.1)
        answer = b""
        deadline = time.monotonic() + READ_TIMEOUT_S
        while not answer and time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                sock.sendall(b"X")  # a byte at a time, never a whole head
                answer = sock.recv(1024)
        assert answer.startswith(b"HTTP/1.0 408")


def _scrapes(server: MetricsServer) -> bool:
    try:
        return "scrapes_seen_total" in _scrape(server)
    except httpx.HTTPError:
        return False


def test_connections_past_the_bound_are_closed_at_once() -> None:
    with _serving(header_timeout_s=30, max_connections=2) as server:
        idle = [_connect(server) for _ in range(2)]  # NOTE: accepted in order: these two hold both slots
        with _connect(server) as extra:
            assert _read_until_closed(extra) == b""  # long before the 30 s header timeout
        for sock in idle:
            sock.close()
        wait_for(lambda: _scrapes(server))
