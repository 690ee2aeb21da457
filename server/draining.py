"""A draining server's port keeps answering until the drain ends.

grpc closes a server's listener when it sends GOAWAY (`server.stop`), at the start of the drain; a client that
connected after that was reset. The refuser takes the port over for the rest of the drain: grpc.health.v1 says
NOT_SERVING, every other call ends UNAVAILABLE with the contract's reason (NOT_SERVING) and a retry hint, as the
server itself answers a call on a connection it still has. It stops (GOAWAY, the listener closed) with the server.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from infer.api import ERROR_REASON_KEY, RETRY_AFTER_KEY, SERVICE_NAME, ErrorReason
from infer.server.lifecycle import RETRY_AFTER_S, SHUTTING_DOWN

logger = logging.getLogger(__name__)

REBIND_TIMEOUT_S = 1.0  # how long the refuser waits for grpc to close the server's listener


class _RefuseAll(grpc.GenericRpcHandler):  # type: ignore[misc]  # grpc ships no stubs
    """Every method but health's: UNAVAILABLE, NOT_SERVING, the retry hint; nothing of the request is read."""

    def service(self, handler_call_details: Any) -> grpc.RpcMethodHandler:
        return grpc.stream_stream_rpc_method_handler(_refuse)


async def _refuse(requests: Any, context: Any) -> None:
    metadata = ((ERROR_REASON_KEY, ErrorReason.NOT_SERVING.value), (RETRY_AFTER_KEY, str(RETRY_AFTER_S)))
    await context.abort(grpc.StatusCode.UNAVAILABLE, f"not serving: {SHUTTING_DOWN}", trailing_metadata=metadata)


class Refuser:
    """`address`: the draining server's (host:port); `credentials`: its TLS (None: plaintext); `options`: its
    channel options (so_reuseport off: never shares the port with another process)."""

    def __init__(
        self, address: str, credentials: grpc.ServerCredentials | None, options: list[tuple[str, Any]]
    ) -> None:
        self.address, self.credentials, self.options = address, credentials, options
        self._server: grpc.aio.Server | None = None

    async def start(self, timeout_s: float = REBIND_TIMEOUT_S) -> bool:
        """Listen on the address as soon as grpc has let it go (within timeout_s); False when it never did."""
        loop = asyncio.get_running_loop()
        deadline_s = loop.time() + timeout_s
        while True:
            server = await self._bound()
            if server is not None:
                break
            if loop.time() > deadline_s:
                logger.warning("drain: %s was not free again within %.1f s: new connections are refused there",
                               self.address, timeout_s)  # fmt: skip
                return False
            await asyncio.sleep(0.001)
        await server.start()
        self._server = server
        logger.info("drain: new calls on %s are answered UNAVAILABLE until the drain ends", self.address)
        return True

    async def _bound(self) -> grpc.aio.Server | None:
        server = grpc.aio.server(options=self.options)
        checker = health.aio.HealthServicer()
        for name in ("", SERVICE_NAME):
            await checker.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(checker, server)
        server.add_generic_rpc_handlers((_RefuseAll(),))
        try:
            port = (
                server.add_secure_port(self.address, self.credentials)
                if self.credentials is not None
                else server.add_insecure_port(self.address)
            )
        except RuntimeError:  # grpc reports a failed bind this way
            port = 0
        return server if port else None

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(None)
            self._server = None
