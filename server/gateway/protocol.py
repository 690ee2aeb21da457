"""uvicorn's h11 protocol with a header timeout: a connection whose request headers do not arrive in time is closed.

uvicorn times out idle keep-alive connections only after a response; a fresh connection, or one that
sends part of its headers and stalls, would hold a socket for as long as the client likes. Here a
timer runs whenever a connection waits for a request's headers. Partial headers get a 408 (OpenAI's
error shape) and a one-line INFO log; a connection that sent nothing is closed without a word.
"""

from __future__ import annotations

import asyncio
import json
import logging

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger(__name__)


def _408(header_timeout_s: float) -> bytes:
    message = f"request headers not received within {header_timeout_s:g} s (setting http_header_timeout_s)"
    error = {"message": message, "type": "invalid_request_error", "param": None, "code": "request_timeout"}
    body = json.dumps({"error": error}).encode()
    head = (
        "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    return head.encode("ascii") + body


class HeaderTimeoutProtocol(H11Protocol):
    """Set `header_timeout_s` in a subclass (`with_header_timeout`); uvicorn builds one per connection."""

    header_timeout_s = 10.0
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:  # still waiting for (the rest of) a request's headers
            self._arm_header_timer()
        else:
            self._disarm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)

    def _arm_header_timer(self) -> None:
        if self._header_timer is None and not self.transport.is_closing():
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._on_header_timeout)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _on_header_timeout(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        pending, _ = self.conn.trailing_data  # bytes received but not yet a whole request head
        client = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
        if pending:
            logger.info("closed %s: partial request headers after %g s", client, self.header_timeout_s)
            self.transport.write(_408(self.header_timeout_s))
        else:
            logger.debug("closed the idle connection of %s after %g s", client, self.header_timeout_s)
        self.transport.close()


def with_header_timeout(header_timeout_s: float) -> type[HeaderTimeoutProtocol]:
    """The protocol class to give uvicorn (`uvicorn.Config(http=...)`)."""
    return type("HeaderTimeoutProtocol", (HeaderTimeoutProtocol,), {"header_timeout_s": header_timeout_s})
