"""The Prometheus port: a small threaded HTTP server, bounded like the other doors.

prometheus_client's own server waits for a request as long as a client likes, one thread each (200 idle
sockets held 200 threads, a slowloris client was never closed). Here:

- a request's first byte must arrive within first_byte_timeout_s (a scrape sends its request at once), its
  whole head within header_timeout_s of the connection (a client trickling a byte a second is closed too):
  a 408 when it sent part of one, silence when it sent nothing;
- the answer must be taken within header_timeout_s (a socket timeout on the writes);
- at most max_connections are open at once. A new one past the bound closes the oldest that is still
  waiting for its head, one that sent no bytes first (so idle sockets cannot blind the scrapes); only when
  every connection is being answered is the new one closed at once (a scrape retries next interval).

One request per connection (HTTP/1.0), as before; every path answers with the metrics.
"""

from __future__ import annotations

import contextlib
import io
import logging
import select
import socket
import sys
import threading
import time
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, MetricsHandler

logger = logging.getLogger(__name__)

MAX_HEAD_BYTES = 16 * 1024  # a scrape's request head is a few hundred bytes
MAX_CONNECTIONS = 16
FIRST_BYTE_TIMEOUT_S = 2.0  # NOTE: a scrape writes its request right after connecting; a round trip or two
_408 = b"HTTP/1.0 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"


@dataclass(eq=False)
class _Connection:
    """One accepted connection, as the accepting thread sees it to pick one to close."""

    sock: socket.socket
    num_head_bytes: int = 0  # received so far
    is_reading_head: bool = True  # False once the head is whole: being answered

    def is_silent(self) -> bool:
        """Nothing received, nothing waiting to be read (a poll that does not block)."""
        if self.num_head_bytes:
            return False
        if self.sock.fileno() < 0:
            return True  # closed by its thread, not yet forgotten
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        return not poller.poll(0)


def read_head(conn: _Connection, timeout_s: float, first_byte_timeout_s: float) -> bytes | None:
    """The request head (up to its blank line), or None when it did not come whole within timeout_s (or its first
    byte within first_byte_timeout_s)."""
    sock, start_s = conn.sock, time.monotonic()
    head = b""
    while b"\r\n\r\n" not in head and b"\n\n" not in head:
        limit_s = timeout_s if head else min(timeout_s, first_byte_timeout_s)
        remaining_s = start_s + limit_s - time.monotonic()
        if remaining_s <= 0 or len(head) > MAX_HEAD_BYTES:
            if head:
                sock.settimeout(1.0)
                sock.sendall(_408)
            return None
        sock.settimeout(remaining_s)
        try:
            chunk = sock.recv(4096)
        except TimeoutError:
            continue  # the loop answers 408 (or nothing)
        if not chunk:
            return None  # the client left, or the server closed it for a newer connection
        head += chunk
        conn.num_head_bytes = len(head)
    conn.is_reading_head = False
    return head


class _Handler(MetricsHandler):
    registry: CollectorRegistry
    timeout = 10.0  # StreamRequestHandler's socket timeout; here also the whole head's
    first_byte_timeout_s = FIRST_BYTE_TIMEOUT_S
    server: MetricsServer

    def handle(self) -> None:
        assert self.timeout is not None
        conn = self.server.connection(self.connection)
        try:
            head = read_head(conn, self.timeout, self.first_byte_timeout_s)
        except OSError:  # reset by the client
            return
        if head is None:
            return
        self.connection.settimeout(self.timeout)
        self.rfile.close()
        self.rfile = io.BytesIO(head)
        self.handle_one_request()


class MetricsServer(ThreadingHTTPServer):
    daemon_threads = True
    # NOTE: socketserver's 5 overflowed under a burst of connections: a SYN dropped costs its client a second
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], handler: type[_Handler], max_connections: int) -> None:
        super().__init__(address, handler)
        self.max_connections = max_connections
        self._lock = threading.Lock()
        self._open: dict[socket.socket, _Connection] = {}  # in the order accepted: oldest first

    def connection(self, sock: socket.socket) -> _Connection:
        with self._lock:
            return self._open.get(sock) or _Connection(sock)  # NOTE: closed for a newer one already

    def _oldest_waiting(self) -> _Connection | None:
        """The connection to close for a new one: the oldest silent one, else the oldest still reading its head."""
        waiting = [c for c in self._open.values() if c.is_reading_head]
        return next((c for c in waiting if c.is_silent()), waiting[0] if waiting else None)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._lock:
            if len(self._open) >= self.max_connections:
                victim = self._oldest_waiting()
                if victim is None:  # every one is being answered: the new one is closed at once
                    self.shutdown_request(request)
                    return
                del self._open[victim.sock]
                with contextlib.suppress(OSError):
                    victim.sock.shutdown(socket.SHUT_RDWR)  # its thread's read ends; the thread closes it
            self._open[request] = _Connection(request)
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._forget(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._forget(request)

    def _forget(self, request: Any) -> None:
        with self._lock:
            self._open.pop(request, None)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that vanished mid-answer: DEBUG; anything else: the traceback, logged (not printed)."""
        if isinstance(sys.exc_info()[1], OSError):
            logger.debug("metrics: %s left mid-answer", client_address)
        else:
            logger.exception("metrics: the request from %s failed", client_address)


def start_metrics_server(
    registry: CollectorRegistry,
    host: str,
    port: int,
    header_timeout_s: float,
    max_connections: int = MAX_CONNECTIONS,
    first_byte_timeout_s: float = FIRST_BYTE_TIMEOUT_S,
) -> MetricsServer:
    """Serve `registry` on host:port from a daemon thread; `shutdown()` then `server_close()` to stop."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    handler = type("MetricsHandler", (_Handler,), {"registry": registry, "timeout": header_timeout_s,
                                                   "first_byte_timeout_s": first_byte_timeout_s})  # fmt: skip
    server_class: type[MetricsServer] = type("MetricsServer", (MetricsServer,), {"address_family": family})
    server = server_class((host, port), handler, max_connections)
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server
