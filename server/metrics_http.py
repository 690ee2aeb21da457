"""The Prometheus port: a small threaded HTTP server, bounded like the other doors.

prometheus_client's own server waits for a request as long as a client likes, one thread each (200 idle
sockets held 200 threads, a slowloris client was never closed). Here:

- a request's head must arrive within header_timeout_s of the connection, in total (a client trickling a
  byte a second is closed too): a 408 when it sent part of one, silence when it sent nothing;
- the answer must be taken within the same time (a socket timeout on the writes);
- at most max_connections are served at once; more are closed at once (a scrape retries next interval).

One request per connection (HTTP/1.0), as before; every path answers with the metrics.
"""

from __future__ import annotations

import io
import logging
import socket
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, MetricsHandler

logger = logging.getLogger(__name__)

MAX_HEAD_BYTES = 16 * 1024  # a scrape's request head is a few hundred bytes
MAX_CONNECTIONS = 16
_408 = b"HTTP/1.0 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"


def read_head(sock: socket.socket, timeout_s: float) -> bytes | None:
    """The request head (up to its blank line), or None when it did not come whole within timeout_s."""
    deadline = time.monotonic() + timeout_s
    head = b""
    while b"\r\n\r\n" not in head and b"\n\n" not in head:
        remaining_s = deadline - time.monotonic()
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
            return None
        head += chunk
    return head


class _Handler(MetricsHandler):
    registry: CollectorRegistry
    timeout = 10.0  # StreamRequestHandler's socket timeout; here also the whole head's

    def handle(self) -> None:
        assert self.timeout is not None
        try:
            head = read_head(self.connection, self.timeout)
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

    def __init__(self, address: tuple[str, int], handler: type[_Handler], max_connections: int) -> None:
        super().__init__(address, handler)
        self._slots = threading.BoundedSemaphore(max_connections)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)  # over the bound: closed at once
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that vanished mid-answer: DEBUG; anything else: the traceback, logged (not printed)."""
        if isinstance(sys.exc_info()[1], OSError):
            logger.debug("metrics: %s left mid-answer", client_address)
        else:
            logger.exception("metrics: the request from %s failed", client_address)


def start_metrics_server(
    registry: CollectorRegistry, host: str, port: int, header_timeout_s: float, max_connections: int = MAX_CONNECTIONS
) -> MetricsServer:
    """Serve `registry` on host:port from a daemon thread; `shutdown()` then `server_close()` to stop."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    handler = type("MetricsHandler", (_Handler,), {"registry": registry, "timeout": header_timeout_s})
    server_class: type[MetricsServer] = type("MetricsServer", (MetricsServer,), {"address_family": family})
    server = server_class((host, port), handler, max_connections)
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server
