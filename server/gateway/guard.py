"""The gateway's front door, an ASGI middleware: framing, browsers, API keys, the body's type, size and read
time, quiet disconnects.

- Both Content-Length and Transfer-Encoding: 400 (RFC 9112 6.3: a smuggling attempt, close after answering).
- Request headers over MAX_HEADER_BYTES in all: 431 (a client error, never the 429 a retry would follow).
- A body larger than max_request_bytes: 413 (by its Content-Length at once, else once it grows past).
- Browsers on the keyless default (`origins.py`): a foreign Origin, or a foreign Host on loopback: 403.
- A key is needed everywhere but /health (probes carry none): 401 in OpenAI's shape.
- A POST body that is not `Content-Type: application/json`: 415 (a web form or a text/plain fetch is not).
- A body that does not arrive within body_timeout_s of the request's start: 408, connection closed.
- A client gone before its body arrived: a one-line INFO log, no traceback.
- While the gateway drains (`Drain`): 503 with Retry-After, connection closed, for every new request but /metrics;
  the requests in flight finish.

A refused request's body is read and dropped first (within the same size and time bounds): closing a socket
with unread bytes in it makes the kernel reset the connection, and the client may lose the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from infer.api import API_KEY_METADATA
from infer.server.gateway.errors import APIError
from infer.server.gateway.origins import BrowserPolicy
from infer.server.gateway.streams import SHUTTING_DOWN
from infer.server.security import ApiKeys

logger = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/health", "/metrics"})  # NOTE: /metrics is served here only when asked (--http-metrics)
JSON_TYPE = "application/json"
# the request's headers, names and values, in all (nginx's default takes 4 x 8 KiB); uvicorn's h11 reads up to
# INCOMPLETE_HEAD_BYTES of a head before it ends, so that a head over the bound gets this 431 however it arrives
MAX_HEADER_BYTES = 32 * 1024
INCOMPLETE_HEAD_BYTES = 64 * 1024


@dataclass(frozen=True)
class HttpLimits:
    max_request_bytes: int = 4 * 1024 * 1024
    header_timeout_s: float = 10.0  # enforced by the protocol (`protocol.py`), the rest here
    body_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if self.max_request_bytes < 1:
            raise ValueError("max_request_bytes: must be >= 1")
        if self.header_timeout_s <= 0 or self.body_timeout_s <= 0:
            raise ValueError("http_header_timeout_s, http_body_timeout_s: must be > 0")


class Drain:
    """The gateway's requests in flight, and whether it drains (new requests refused 503, Retry-After)."""

    def __init__(self) -> None:
        self.is_draining = False
        self.num_in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    async def drain(self, grace_s: float) -> bool:
        """Refuse new requests from now on; wait until those in flight end. False if some outlived grace_s."""
        self.is_draining = True
        try:
            await asyncio.wait_for(self._idle.wait(), grace_s)
        except TimeoutError:
            return False
        return True

    @contextlib.contextmanager
    def in_flight(self) -> Iterator[None]:
        self.num_in_flight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.num_in_flight -= 1
            if self.num_in_flight == 0:
                self._idle.set()


class _BodyError(Exception):
    """The body broke a limit: answer `error` and close the connection."""

    def __init__(self, error: APIError) -> None:
        super().__init__(error.message)
        self.error = error


def _too_large(limit: int) -> APIError:
    message = f"request body larger than {limit} bytes (setting max_request_bytes)"
    return APIError(413, message, code="request_too_large")


class _Body:
    """`receive` with the limits applied while the body is still arriving; afterwards as it was."""

    def __init__(self, receive: Receive, limits: HttpLimits) -> None:
        self._receive, self.limits = receive, limits
        self._deadline = asyncio.get_running_loop().time() + limits.body_timeout_s
        self.num_bytes, self.is_complete = 0, False

    async def receive(self) -> Message:
        if self.is_complete:  # later calls wait for a disconnect while the response streams: no limit
            return await self._receive()
        try:
            async with asyncio.timeout_at(self._deadline):
                message = await self._receive()
        except TimeoutError:
            text = f"request body not received within {self.limits.body_timeout_s:g} s (setting http_body_timeout_s)"
            raise _BodyError(APIError(408, text, code="request_timeout")) from None
        if message["type"] == "http.request":
            self.num_bytes += len(message.get("body", b""))
            self.is_complete = not message.get("more_body", False)
            if self.num_bytes > self.limits.max_request_bytes:
                raise _BodyError(_too_large(self.limits.max_request_bytes))
        return message


def _header(scope: Scope, name: bytes) -> str | None:
    value = next((v for k, v in scope["headers"] if k == name), None)
    return None if value is None else bytes(value).decode("latin-1")


def _client(scope: Scope) -> str:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else "a client"


def header_bytes(scope: Scope) -> int:
    return sum(len(name) + len(value) for name, value in scope["headers"])


def _media_type_refusal(content_type: str | None) -> APIError | None:
    if content_type is not None and content_type.split(";")[0].strip().lower() == JSON_TYPE:
        return None
    got = "none" if content_type is None else repr(content_type[:100])
    return APIError(415, f"Content-Type must be {JSON_TYPE} (got {got})", code="unsupported_media_type")


class Guard:
    def __init__(
        self, app: ASGIApp, keys: ApiKeys | None, limits: HttpLimits, policy: BrowserPolicy, drain: Drain | None = None
    ) -> None:
        self.app, self.keys, self.limits, self.policy = app, keys, limits, policy
        self.drain = drain if drain is not None else Drain()

    def _refusal(self, scope: Scope) -> APIError | None:
        if self.drain.is_draining and scope["path"] != "/metrics":
            return SHUTTING_DOWN
        if (num_bytes := header_bytes(scope)) > MAX_HEADER_BYTES:
            message = f"request headers of {num_bytes} bytes: more than {MAX_HEADER_BYTES} in all"
            return APIError(431, message, code="request_header_fields_too_large")
        length = _header(scope, b"content-length")
        if length is not None and _header(scope, b"transfer-encoding") is not None:
            message = "a request may not carry both Content-Length and Transfer-Encoding (RFC 9112, section 6.3)"
            return APIError(400, message, code="invalid_request")
        if length is not None and length.isdigit() and int(length) > self.limits.max_request_bytes:
            return _too_large(self.limits.max_request_bytes)
        refusal = self.policy.refusal(_header(scope, b"origin"), _header(scope, b"host"))
        if refusal is not None:
            return refusal
        if self.keys is not None and scope["path"] not in OPEN_PATHS:
            key_refusal = self.keys.refusal(_header(scope, API_KEY_METADATA.encode()))
            if key_refusal is not None:
                return APIError(401, key_refusal, code="invalid_api_key")
        if scope["method"] == "POST" and (refusal := _media_type_refusal(_header(scope, b"content-type"))):
            return refusal
        return None

    async def _drop_body(self, receive: Receive) -> bool:
        """Read the body to its end and drop it (bounded like any body): False when it broke a bound or ended."""
        body = _Body(receive, self.limits)
        try:
            while not body.is_complete:
                if (await body.receive())["type"] == "http.disconnect":
                    return False
        except _BodyError:
            return False
        return True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is not None:
            is_read = refusal.status != 413 and await self._drop_body(receive)
            # NOTE: 400 here is CL + TE: RFC 9112 says close; a 431's client sends the same heads again; a 503
            # while draining: the client's retry takes a new connection, which a balancer may send elsewhere
            must_close = not is_read or refusal.status in (400, 431, 503)
            await refusal.response({"Connection": "close"} if must_close else {})(scope, receive, send)
            return
        body = _Body(receive, self.limits)
        try:
            with self.drain.in_flight():
                await self.app(scope, body.receive, send)
        except _BodyError as e:
            logger.info("%s %s from %s: %d: %s", scope["method"], scope["path"], _client(scope), e.error.status, e)
            await e.error.response({"Connection": "close"})(scope, receive, send)
        except ClientDisconnect:
            logger.info("%s %s: %s left before sending its whole body", scope["method"], scope["path"], _client(scope))
