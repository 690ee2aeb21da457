"""The gateway's gRPC client of the model server: one channel, opened on first use in the serving loop."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from infer.clients.channel import ClientTls, aio_channel
from infer.clients.proto.v1 import inference_pb2 as pb
from infer.clients.proto.v1 import inference_pb2_grpc as pb_grpc
from infer.clients.types import SERVICE_NAME
from infer.server.gateway.errors import from_grpc

UNARY_TIMEOUT_S = 10.0
Metadata = Sequence[tuple[str, str]]
GenerateCall = Any  # grpc.aio.UnaryStreamCall[pb.GenerateRequest, pb.GenerateResponse]; grpc ships no stubs


class Upstream:
    """`address`: host:port (or unix:PATH); `tls`: how to reach it over TLS (None: plaintext).

    Calls carry the caller's metadata, its `authorization` header included: the model server checks the key.
    """

    def __init__(self, address: str, timeout_s: float | None = None, tls: ClientTls | None = None) -> None:
        self.address, self.timeout_s, self.tls = address, timeout_s, tls
        self._channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.InferenceServiceStub | None = None
        self._health: health_pb2_grpc.HealthStub | None = None
        self._model_info: pb.GetModelInfoResponse | None = None

    def _inference(self) -> pb_grpc.InferenceServiceStub:
        # NOTE: lazily: a grpc.aio channel belongs to the event loop it is created in
        if self._stub is None:
            # NOTE: round robin, retries of UNAVAILABLE, and behind a headless Service (`dns:///name:port`) health
            # checking of each model server pod: one that drains gets no new request (clients/channel.py)
            self._channel = aio_channel(self.address, self.tls)
            self._stub = pb_grpc.InferenceServiceStub(self._channel)  # type: ignore[no-untyped-call]
            self._health = health_pb2_grpc.HealthStub(self._channel)
        return self._stub

    def _unary_timeout_s(self) -> float:
        return UNARY_TIMEOUT_S if self.timeout_s is None else min(self.timeout_s, UNARY_TIMEOUT_S)

    async def model_info(self, metadata: Metadata = ()) -> pb.GetModelInfoResponse:
        """The served model; asked once (with the first caller's key), then remembered."""
        if self._model_info is None:
            request, timeout_s = pb.GetModelInfoRequest(), self._unary_timeout_s()
            try:
                info = await self._inference().GetModelInfo(request, timeout=timeout_s, metadata=metadata)
            except grpc.aio.AioRpcError as e:
                raise from_grpc(e) from None
            self._model_info = info
        return self._model_info

    def generate(self, request: pb.GenerateRequest, metadata: Metadata = ()) -> GenerateCall:
        """Start a Generate stream; its errors surface while reading it."""
        return self._inference().Generate(request, timeout=self.timeout_s, metadata=metadata)

    async def health(self) -> str:
        """The server's grpc.health.v1 status for the inference service (SERVING, NOT_SERVING, ...)."""
        self._inference()
        assert self._health is not None
        request = health_pb2.HealthCheckRequest(service=SERVICE_NAME)
        try:
            response = await self._health.Check(request, timeout=self._unary_timeout_s())
        except grpc.aio.AioRpcError as e:
            return f"UNREACHABLE ({e.code().name})"
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
        self._channel = self._stub = self._health = None
