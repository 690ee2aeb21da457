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

from infer.api import DEFAULT_ADDRESS, pb, pb_grpc
from infer.clients.channel import (
    MAX_ATTEMPTS,
    ChannelPool,
    ClientTls,
    Lane,
    channel,
    retry_backoff_s,
    with_api_key,
)
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


class GenerateStream:
    """One Generate call, read message by message: `await read()` (None at its end) or `async for`; `cancel()`
    aborts the request on the server (a no-op once the call ended). A failed call raises InferError."""

    def __init__(self, call: Any) -> None:
        self._call = call  # grpc.aio.UnaryStreamCall; grpc ships no type stubs

    def __aiter__(self) -> GenerateStream:
        return self

    async def __anext__(self) -> pb.GenerateResponse:
        response = await self.read()
        if response is None:
            raise StopAsyncIteration
        return response

    async def read(self) -> pb.GenerateResponse | None:
        try:
            response = await self._call.read()
        except grpc.RpcError as e:
            raise InferError.from_rpc_error(e) from None
        return None if response is grpc.aio.EOF else response

    def cancel(self) -> None:
        self._call.cancel()


class AsyncInferClient:
    """The asyncio client: `async for chunk in client.generate(...)`; the OpenAI gateway and `infer bench` use it.

    Its channel opens on first use, in the running event loop (a grpc.aio channel belongs to the loop it is made
    in): make the client anywhere, use it in one loop. `unary_timeout_s` bounds model_info, tokenize and health
    (default: timeout_s); `metadata` given to a call goes with it (the API key is added unless it carries one).
    `max_streams_per_channel`: the server's cap on one connection's concurrent streams (its
    `--max-streams-per-connection`); a call that finds every open channel at the cap opens another channel (its own
    connection) rather than wait behind the others. None: one channel, whatever the server's cap.
    """

    def __init__(
        self,
        address: str = DEFAULT_ADDRESS,
        *,
        timeout_s: float | None = None,
        tls: ClientTls | None = None,
        api_key: str | None = None,
        unary_timeout_s: float | None = None,
        max_streams_per_channel: int | None = None,
    ) -> None:
        self.address, self.timeout_s, self.tls, self.api_key = address, timeout_s, tls, api_key
        self.unary_timeout_s = timeout_s if unary_timeout_s is None else unary_timeout_s
        self.channels = ChannelPool(address, tls, max_streams_per_channel)

    def _lane(self, call: Any, lane: Lane) -> Any:
        """`call` (started on `lane`) counted on its lane until it ends."""
        call.add_done_callback(lambda _: self.channels.release(lane))
        return call

    def stream(
        self, request: pb.GenerateRequest, *, timeout_s: float | None = None, metadata: Metadata = ()
    ) -> GenerateStream:
        """Start a Generate call for a whole request message (tools, constraints, ...); errors come with reads.

        NOTE: the channel retries a call refused UNAVAILABLE before its first message (`infer.clients.channel`).
        """
        lane = self.channels.acquire()
        metadata = with_api_key(metadata, self.api_key)
        call = lane.stub.Generate(request, timeout=timeout_s or self.timeout_s, metadata=metadata)
        return GenerateStream(self._lane(call, lane))

    async def generate(
        self,
        prompt: Prompt,
        sampling: Sampling | None = None,
        *,
        request_id: str = "",
        timeout_s: float | None = None,
        metadata: Metadata = (),
    ) -> AsyncIterator[Chunk]:
        stream = self.stream(generate_request(prompt, sampling, request_id), timeout_s=timeout_s, metadata=metadata)
        try:
            while (response := await stream.read()) is not None:
                yield Chunk.from_proto(response)
        finally:
            stream.cancel()

    async def complete(self, prompt: Prompt, sampling: Sampling | None = None, **kwargs: Any) -> Completion:
        completion = Completion()
        async for chunk in self.generate(prompt, sampling, **kwargs):
            completion.add(chunk)
        return completion

    async def model_info(self, *, metadata: Metadata = ()) -> ModelInfo:
        return ModelInfo.from_proto(await self._unary("GetModelInfo", pb.GetModelInfoRequest(), metadata))

    async def tokenize(
        self,
        text: ChatOrText | pb.ChatMessages,
        *,
        add_special_tokens: bool | None = None,
        add_generation_prompt: bool | None = None,
        tools: Sequence[pb.Tool] = (),
        metadata: Metadata = (),
    ) -> list[int]:
        """Token ids of a text, or of chat messages (and tools) rendered with the model's chat template."""
        options = _tokenize_options(add_special_tokens, add_generation_prompt)
        request = tokenize_request(text, tools, **options)
        return list((await self._unary("Tokenize", request, metadata)).token_ids)

    async def tokenize_message(self, request: pb.TokenizeRequest, *, metadata: Metadata = ()) -> pb.TokenizeResponse:
        """Tokenize a whole request message (token ids, a Generate's sampling to check it as Generate would); the
        response as it is: ids, text, max_tokens."""
        response: pb.TokenizeResponse = await self._unary("Tokenize", request, metadata)
        return response

    async def health(self, service: str = "") -> str:
        response = await self._unary("Check", health_pb2.HealthCheckRequest(service=service))
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

    async def _unary(self, method: str, request: Any, metadata: Metadata = ()) -> Any:
        """A unary call by its method's name (`Check`: health's, the rest the inference service's)."""
        lane = self.channels.acquire()
        stub = lane.health if method == "Check" else lane.stub
        metadata = with_api_key(metadata, self.api_key)
        try:
            return await self._lane(
                getattr(stub, method)(request, timeout=self.unary_timeout_s, metadata=metadata), lane
            )
        except grpc.RpcError as e:
            raise InferError.from_rpc_error(e) from None

    async def close(self) -> None:
        """Close the channels; a later call opens a new one."""
        await self.channels.close()

    async def __aenter__(self) -> AsyncInferClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
