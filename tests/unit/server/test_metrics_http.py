"""The Prometheus port, bounded like the other doors: idle and slowloris clients closed, threads capped."""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
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


def test_past_the_bound_the_oldest_silent_connection_makes_room() -> None:
    with _serving(header_timeout_s=30, max_connections=2) as server:
        idle = [_connect(server) for _ in range(2)]  # NOTE: accepted in order: these two hold both slots
        wait_for(lambda: len(server._open) == 2)
        with _connect(server):
            assert _read_until_closed(idle[0]) == b""  # long before the 30 s header timeout
            assert _scrapes(server)  # closes idle[1] (or the third): both sent nothing
        for sock in idle:
            sock.close()


def test_a_connection_that_sent_part_of_its_head_outlives_silent_ones() -> None:
    with _serving(header_timeout_s=30, max_connections=2) as server, _connect(server) as partial:
        partial.sendall(b"GET /metrics HTTP/1.0\r\n")
        wait_for(lambda: any(c.num_head_bytes for c in server._open.values()))
        with _connect(server) as silent:
            assert _scrapes(server)  # room made by closing `silent`, though `partial` is older
            assert _read_until_closed(silent) == b""
        partial.sendall(b"\r\n")
        assert b"scrapes_seen_total" in _read_until_closed(partial)


def test_a_connection_that_sends_nothing_is_closed_after_the_first_byte_timeout() -> None:
    with _serving(header_timeout_s=30) as server:
        server.RequestHandlerClass.first_byte_timeout_s = 0.3  # type: ignore[attr-defined]
        start_s = time.monotonic()
        with _connect(server) as sock:
            assert _read_until_closed(sock) == b""
        assert time.monotonic() - start_s < 5  # not the 30 s head timeout


class _IdleSockets:
    """`count` connections that never send a byte, each reopened as soon as the server closes it."""

    def __init__(self, server: MetricsServer, count: int) -> None:
        self.server, self.count = server, count
        self.num_reopened = 0
        self.opened = threading.Event()  # all `count` opened once
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._hold, daemon=True)

    def _hold(self) -> None:
        with selectors.DefaultSelector() as selector:
            for _ in range(self.count):
                selector.register(_connect(self.server), selectors.EVENT_READ)
            self.opened.set()
            while not self._stop.is_set():
                for key, _ in selector.select(timeout=0.05):
                    selector.unregister(key.fileobj)
                    key.fileobj.close()  # type: ignore[union-attr]
                    selector.register(_connect(self.server), selectors.EVENT_READ)
                    self.num_reopened += 1
            for key in list(selector.get_map().values()):
                key.fileobj.close()  # type: ignore[union-attr]

    def __enter__(self) -> _IdleSockets:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def test_scrapes_are_answered_under_40_idle_sockets() -> None:
    """NOTE: before, the 16 slots were held by idle sockets and 16 of 20 scrapes were refused."""
    with _serving(header_timeout_s=10) as server, _IdleSockets(server, 40) as idle:
        assert idle.opened.wait(30)
        assert sum(_scrapes(server) for _ in range(20)) == 20
        assert idle.num_reopened > 0  # the idle sockets were at the cap all along
