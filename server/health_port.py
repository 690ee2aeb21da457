"""A plaintext port that serves grpc.health.v1 and nothing else, for probes that cannot speak TLS.

The kubelet's native `grpc:` probes have no TLS. With TLS on the main port, `health_port` opens a second,
plaintext gRPC server holding the same health servicer as the main one: both answer the same status at
every moment (NOT_SERVING while loading, SERVING, NOT_SERVING from the start of a drain). It carries no
inference service, no reflection and no API keys: only whether this replica serves.
"""

from __future__ import annotations

import logging

import grpc
from grpc_health.v1 import health, health_pb2_grpc

logger = logging.getLogger(__name__)

OPTIONS = (
    ("grpc.so_reuseport", 0),  # NOTE: a busy port must fail, as the main port does
    ("grpc.max_receive_message_length", 4096),  # health requests are a service name
)


class HealthPort:
    """`start` listens on host:port (0 = any free port, in `port`); `stop` closes it."""

    def __init__(self, servicer: health.aio.HealthServicer, host: str, port: int) -> None:
        self.servicer, self.host, self.port = servicer, host, port
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        server = grpc.aio.server(options=OPTIONS)
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)
        address = f"{self.host}:{self.port}"
        try:
            port = server.add_insecure_port(address)
        except RuntimeError as e:  # grpc reports a failed bind this way
            raise OSError(f"health_port: cannot listen on {address} (in use?): {e}") from None
        if port == 0:
            raise OSError(f"health_port: cannot listen on {address} (in use?)")
        await server.start()
        self._server, self.port = server, int(port)
        logger.info("gRPC health (plaintext, health only) on %s:%d", self.host, self.port)

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=None)
            self._server = None
