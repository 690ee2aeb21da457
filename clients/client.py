"""Python clients of the infer.v1 service, blocking and asyncio.

    with InferClient("127.0.0.1:50051") as client:
        for chunk in client.generate("Hello", Sampling(max_tokens=16, temperature=0)):
            print(chunk.text, end="", flush=True)

Failed RPCs raise InferError (its `code` is the gRPC status code). Leaving a `generate`
loop early cancels the RPC, which aborts the request on the server. A server started with TLS or
API keys needs `tls=ClientTls(ca_file=...)` and `api_key=...` (sent as `authorization: Bearer`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from infer.clients.channel import MAX_ATTEMPTS, ClientTls, aio_channel, channel, retry_backoff_s, with_api_key
from infer.clients.proto.v1 import inference_pb2 as pb
from infer.clients.proto.v1 import inference_pb2_grpc as pb_grpc
from infer.clients.types import (
    Chunk,
    Completion,
    InferError,
    ModelInfo,
    Prompt,
    Sampling,
    generate_request,
    tokenize_request,
)

DEFAULT_ADDRESS = "127.0.0.1:50051"
Metadata = Sequence[tuple[str, str]]
ChatOrText = str | Sequence[Mapping[str, str]]


def _tokenize_options(add_special_tokens: bool | None, add_generation_prompt: bool | None) -> dict[str, Any]:
    options = {"add_special_tokens": add_special_tokens, "add_generation_prompt": add_generation_prompt}
    return {k: v for k, v in options.items() if v is not None}


class InferClient:
    """A blocking client; one channel, reused by every call."""

    def __init__(
        self,
        address: str = DEFAULT_ADDRESS,
        *,
        timeout_s: float | None = None,
        tls: ClientTls | None = None,
        api_key: str | None = None,
    ) -> None:
        self.address, self.timeout_s, self.api_key = address, timeout_s, api_key
        self._channel = channel(address, tls)
        self._stub = pb_grpc.InferenceServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._health = health_pb2_grpc.HealthStub(self._channel)

    def generate(
        self,
        prompt: Prompt,
        sampling: Sampling | None = None,
        *,
        request_id: str = "",
        timeout_s: float | None = None,
        metadata: Metadata = (),
    ) -> Iterator[Chunk]:
        """Stream chunks as the server generates them (usually one token each).

        A stream refused UNAVAILABLE before its first chunk (a server loading, draining or gone) is retried, up
        to 4 times with backoff, as the channel retries the unary calls (`infer.clients.channel`).
        """
        request = generate_request(prompt, sampling, request_id)
        metadata = with_api_key(metadata, self.api_key)
        timeout_s = timeout_s or self.timeout_s
        deadline_s = None if timeout_s is None else time.monotonic() + timeout_s
        for attempt in range(1, MAX_ATTEMPTS + 1):
            left_s = None if deadline_s is None else max(0.0, deadline_s - time.monotonic())
            call = self._stub.Generate(request, timeout=left_s, metadata=metadata)
            started = False
            try:
                for response in call:
                    started = True
                    yield Chunk.from_proto(response)
                return
            except grpc.RpcError as e:
                retry_s = retry_backoff_s(attempt)
                late = deadline_s is not None and time.monotonic() + retry_s >= deadline_s
                if started or e.code() is not grpc.StatusCode.UNAVAILABLE or attempt == MAX_ATTEMPTS or late:
                    raise InferError.from_rpc_error(e) from None
            finally:
                call.cancel()  # a no-op when the stream ended; aborts the request when the caller left early
            time.sleep(retry_s)

    def complete(self, prompt: Prompt, sampling: Sampling | None = None, **kwargs: Any) -> Completion:
        completion = Completion()
        for chunk in self.generate(prompt, sampling, **kwargs):
            completion.add(chunk)
        return completion

    def model_info(self) -> ModelInfo:
        return ModelInfo.from_proto(self._unary(self._stub.GetModelInfo, pb.GetModelInfoRequest()))

    def tokenize(
        self,
        text: ChatOrText,
        *,
        add_special_tokens: bool | None = None,
        add_generation_prompt: bool | None = None,
    ) -> list[int]:
        """Token ids of a text, or of chat messages rendered with the model's chat template."""
        request = tokenize_request(text, **_tokenize_options(add_special_tokens, add_generation_prompt))
        return list(self._unary(self._stub.Tokenize, request).token_ids)

    def health(self, service: str = "") -> str:
        """SERVING, NOT_SERVING, ... (grpc.health.v1)."""
        response = self._unary(self._health.Check, health_pb2.HealthCheckRequest(service=service))
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))

    def wait_until_serving(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if self.health() == "SERVING":
                    return
            except InferError as e:
                if e.code is not grpc.StatusCode.UNAVAILABLE:
                    raise
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.address} not SERVING after {timeout_s:.0f} s")
            time.sleep(0.1)

    def _unary(self, method: Any, request: Any) -> Any:
        try:
            return method(request, timeout=self.timeout_s, metadata=with_api_key((), self.api_key))
        except grpc.RpcError as e:
            raise InferError.from_rpc_error(e) from None

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> InferClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncInferClient:
    """The asyncio client: `async for chunk in client.generate(...)`."""

    def __init__(
        self,
        address: str = DEFAULT_ADDRESS,
        *,
        timeout_s: float | None = None,
        tls: ClientTls | None = None,
        api_key: str | None = None,
    ) -> None:
        self.address, self.timeout_s, self.api_key = address, timeout_s, api_key
        self._channel = aio_channel(address, tls)
        self._stub = pb_grpc.InferenceServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._health = health_pb2_grpc.HealthStub(self._channel)

    async def generate(
        self,
        prompt: Prompt,
        sampling: Sampling | None = None,
        *,
        request_id: str = "",
        timeout_s: float | None = None,
        metadata: Metadata = (),
    ) -> AsyncIterator[Chunk]:
        request = generate_request(prompt, sampling, request_id)
        metadata = with_api_key(metadata, self.api_key)
        call = self._stub.Generate(request, timeout=timeout_s or self.timeout_s, metadata=metadata)
        try:
            async for response in call:
                yield Chunk.from_proto(response)
        except grpc.RpcError as e:
            raise InferError.from_rpc_error(e) from None
        finally:
            call.cancel()

    async def complete(self, prompt: Prompt, sampling: Sampling | None = None, **kwargs: Any) -> Completion:
        completion = Completion()
        async for chunk in self.generate(prompt, sampling, **kwargs):
            completion.add(chunk)
        return completion

    async def model_info(self) -> ModelInfo:
        return ModelInfo.from_proto(await self._unary(self._stub.GetModelInfo, pb.GetModelInfoRequest()))

    async def tokenize(
        self,
        text: ChatOrText,
        *,
        add_special_tokens: bool | None = None,
        add_generation_prompt: bool | None = None,
    ) -> list[int]:
        request = tokenize_request(text, **_tokenize_options(add_special_tokens, add_generation_prompt))
        return list((await self._unary(self._stub.Tokenize, request)).token_ids)

    async def health(self, service: str = "") -> str:
        response = await self._unary(self._health.Check, health_pb2.HealthCheckRequest(service=service))
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))

    async def wait_until_serving(self, timeout_s: float = 60.0) -> None:
        async with asyncio.timeout(timeout_s):
            while True:
                try:
                    if await self.health() == "SERVING":
                        return
                except InferError as e:
                    if e.code is not grpc.StatusCode.UNAVAILABLE:
                        raise
                await asyncio.sleep(0.1)

    async def _unary(self, method: Any, request: Any) -> Any:
        try:
            return await method(request, timeout=self.timeout_s, metadata=with_api_key((), self.api_key))
        except grpc.RpcError as e:
            raise InferError.from_rpc_error(e) from None

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncInferClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
