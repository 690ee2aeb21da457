"""The metrics port under idle connections (issue 27, finding 6), on the fake engine's server: up to 40 sockets
that send nothing and up to 8 that begin a request head and never finish it, reopened as fast as the server closes
them or not, while Prometheus scrapes.

Every scrape is answered (200, the engine's gauges: no request, no KV block, no compile pending), and every idle
socket is closed by the server: a silent one without a word (past the 16-connection cap at once, else within the
2 s first-byte bound), a begun head with a 408 or, when it made room for a newer connection, without a word.
`make test` runs a short pass, `make fuzz` a long one.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from tests.fuzz.strategies import examples
from tests.integration.grpc_helpers import ServerThread, running_fake_server

pytestmark = pytest.mark.fuzz
HEADER_TIMEOUT_S = 1.0  # http_header_timeout_s: a begun head is answered 408 after this
CLOSE_BOUND_S = 15.0  # every idle socket is closed well within this: a bound, not a timing
BEGUN = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n"  # a head without its blank line


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    with running_fake_server({"metrics_port": 0, "http_header_timeout_s": HEADER_TIMEOUT_S}) as s:
        yield s


@dataclass(frozen=True)
class Idle:
    num_silent: int
    num_begun: int
    reopen: bool  # a new socket for each one the server closes, while the scrapes run
    num_scrapes: int


class IdleSockets:
    """The idle sockets of one example; with `reopen`, a thread replaces each one the server closes (by one of
    the same kind) until `stop`."""

    def __init__(self, port: int, idle: Idle) -> None:
        self.port = port
        self.begun = [False] * idle.num_silent + [True] * idle.num_begun
        self.sockets = [self._open(begun) for begun in self.begun]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._reopen, daemon=True) if idle.reopen else None
        if self._thread is not None:
            self._thread.start()

    def _open(self, begun: bool) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=CLOSE_BOUND_S)
        if begun:
            sock.sendall(BEGUN)
        return sock

    def _reopen(self) -> None:
        while not self._stop.is_set():
            readable, _, _ = select.select(self.sockets, [], [], 0.05)
            for sock in readable:
                _read_to_end(sock)
                sock.close()
                i = self.sockets.index(sock)
                self.sockets[i] = self._open(self.begun[i])

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(CLOSE_BOUND_S)

    def wait_closed(self) -> list[bytes]:
        """What each socket received before the server closed it."""
        received: dict[socket.socket, bytes] = {}
        while len(received) < len(self.sockets):
            pending = [sock for sock in self.sockets if sock not in received]
            readable, _, _ = select.select(pending, [], [], CLOSE_BOUND_S)
            assert readable, f"{len(pending)} idle sockets still open after {CLOSE_BOUND_S} s"
            received |= {sock: _read_to_end(sock) for sock in readable}
        return [received[sock] for sock in self.sockets]

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()


def _read_to_end(sock: socket.socket) -> bytes:
    """What a readable socket holds up to its end: nothing, or an answer (a 408) that the server closes after."""
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            data += chunk
    return data


IDLE = st.builds(Idle, st.integers(0, 40), st.integers(0, 8), st.booleans(), st.integers(1, 4))


@examples(ci=3, fuzz=120)
@given(idle=IDLE)
def test_scrapes_are_answered_and_idle_sockets_closed(server: ServerThread, idle: Idle) -> None:
    port = server.server.metrics_port
    assert port is not None
    event(f"{'over' if idle.num_silent + idle.num_begun > 16 else 'within'} the cap, reopened: {idle.reopen}")
    sockets = IdleSockets(port, idle)
    try:
        for _ in range(idle.num_scrapes):
            response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=CLOSE_BOUND_S)
            assert response.status_code == 200, response.text
            lines = response.text.splitlines()
            assert {
                "infer_kv_blocks_used 0.0",
                "infer_requests_running 0.0",
                "infer_grammar_compiles_pending 0.0",
            } <= set(lines)
        sockets.stop()
        for data in sockets.wait_closed():
            assert data == b"" or data.startswith(b"HTTP/1.0 408 "), data[:200]
    finally:
        sockets.stop()
        sockets.close()
    server.wait_idle()
