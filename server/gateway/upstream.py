"""What the gateway asks the model server, over the shared asyncio client (`infer.clients.AsyncInferClient`:
channels opened on first use in the serving loop, one more whenever the open ones carry the server's streams per
connection, so that HTTP streams never queue behind that cap, ahead of the server's scheduler): model info (asked
once), prompt tokens (Tokenize, for the render endpoints), Generate streams and health. Failed calls raise
APIError."""

from __future__ import annotations

from collections.abc import Sequence

from infer.api import SERVICE_NAME, pb
from infer.clients import AsyncInferClient, GenerateStream, InferError, ModelInfo
from infer.clients.channel import ClientTls
from infer.server.gateway.errors import from_grpc

UNARY_TIMEOUT_S = 10.0
Metadata = Sequence[tuple[str, str]]


class Upstream:
    """`address`: host:port (or unix:PATH); `tls`: how to reach it over TLS (None: plaintext); `max_streams`: the
    server's streams per connection (its `max_streams_per_connection`; None: one connection, whatever its cap).

    Calls carry the caller's metadata, its `authorization` header included: the model server checks the key.
    """

    def __init__(
        self,
        address: str,
        timeout_s: float | None = None,
        tls: ClientTls | None = None,
        max_streams: int | None = None,
    ) -> None:
        self.address, self.timeout_s = address, timeout_s
        unary_timeout_s = UNARY_TIMEOUT_S if timeout_s is None else min(timeout_s, UNARY_TIMEOUT_S)
        # NOTE: round robin, retries of UNAVAILABLE, and behind a headless Service (`dns:///name:port`) health
        # checking of each model server pod: one that drains gets no new request (clients/channel.py)
        self.client = AsyncInferClient(address, timeout_s=timeout_s, tls=tls, unary_timeout_s=unary_timeout_s,
                                       max_streams_per_channel=max_streams)  # fmt: skip
        self._model_info: ModelInfo | None = None

    async def model_info(self, metadata: Metadata = ()) -> ModelInfo:
        """The served model; asked once (with the first caller's key), then remembered."""
        if self._model_info is None:
            try:
                self._model_info = await self.client.model_info(metadata=metadata)
            except InferError as e:
                raise from_grpc(e) from None
        return self._model_info

    async def tokenize(self, request: pb.TokenizeRequest, metadata: Metadata = ()) -> pb.TokenizeResponse:
        """The model server's Tokenize: a render request's ids, checked as its Generate would be."""
        try:
            return await self.client.tokenize_message(request, metadata=metadata)
        except InferError as e:
            raise from_grpc(e) from None

    def generate(self, request: pb.GenerateRequest, metadata: Metadata = ()) -> GenerateStream:
        """Start a Generate stream; its errors (InferError) surface while reading it."""
        return self.client.stream(request, metadata=metadata)

    async def health(self) -> str:
        """The server's grpc.health.v1 status for the inference service (SERVING, NOT_SERVING, ...)."""
        try:
            return await self.client.health(SERVICE_NAME)
        except InferError as e:
            return f"UNREACHABLE ({e.code.name})"

    async def close(self) -> None:
        await self.client.close()
