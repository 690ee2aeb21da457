"""The Python clients against a fake servicer (no model): requests built right, chunks, errors, cancellation."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from infer.api import pb, pb_grpc
from infer.clients import AsyncInferClient, InferClient, InferError, Sampling
from infer.clients.types import generate_request


class FakeServicer(pb_grpc.InferenceServiceServicer):
    def __init__(self) -> None:
        self.requests: list[pb.GenerateRequest] = []
        self.tokenized: list[pb.TokenizeRequest] = []
        self.metadata: list[dict[str, str]] = []  # of each Generate and Tokenize call
        self.cancelled = threading.Event()

    def Generate(  # noqa: N802 (gRPC method names)
        self, request: pb.GenerateRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.GenerateResponse]:
        self.requests.append(request)
        self.metadata.append(dict(context.invocation_metadata()))
        if request.prompt == "invalid":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "sampling.top_p: must be in (0, 1]")
        if request.prompt == "endless":
            context.add_callback(self.cancelled.set)
            while context.is_active():
                yield pb.GenerateResponse(request_id="endless", token_ids=[0], text=".")
                time.sleep(0.01)
            return
        yield pb.GenerateResponse(request_id="r1", token_ids=[1], text="Hel")
        yield pb.GenerateResponse(
            request_id="r1", token_ids=[2], text="lo", finish_reason=pb.FINISH_REASON_STOP,
            usage=pb.Usage(prompt_tokens=4, completion_tokens=2, cached_tokens=0),
            timings=pb.Timings(queue_s=0.1, ttft_s=0.2, total_s=0.3, num_preemptions=0),
        )  # fmt: skip

    def GetModelInfo(self, request: Any, context: grpc.ServicerContext) -> pb.GetModelInfoResponse:  # noqa: N802
        return pb.GetModelInfoResponse(
            model_id="fake", max_model_len=64, vocab_size=100, eos_token_ids=[2], kernels="cpu", max_waiting_requests=8
        )

    def Tokenize(self, request: pb.TokenizeRequest, context: grpc.ServicerContext) -> pb.TokenizeResponse:  # noqa: N802
        self.tokenized.append(request)
        self.metadata.append(dict(context.invocation_metadata()))
        if request.text == "slow":
            time.sleep(1.0)
        if request.WhichOneof("input") == "messages":
            return pb.TokenizeResponse(token_ids=[len(request.messages.messages)])
        return pb.TokenizeResponse(token_ids=[len(request.text), int(request.add_special_tokens)])


@pytest.fixture(scope="module")
def fake() -> Iterator[tuple[str, FakeServicer]]:
    servicer = FakeServicer()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_InferenceServiceServicer_to_server(servicer, server)
    health_servicer = health.HealthServicer()
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", servicer
    server.stop(0)


def test_generate_request_sets_only_the_given_sampling_fields() -> None:
    request = generate_request("Hi", Sampling(max_tokens=5, temperature=0.0, stop=("\n",)), "id-1")
    assert request.request_id == "id-1" and request.prompt == "Hi"
    assert request.sampling.HasField("temperature") and request.sampling.temperature == 0.0
    assert not request.sampling.HasField("top_p") and list(request.sampling.stop) == ["\n"]
    assert list(generate_request([1, 2], None).token_ids.ids) == [1, 2]
    chat = generate_request([{"role": "user", "content": "Hi"}], None)
    assert chat.WhichOneof("input") == "messages" and chat.messages.messages[0].content == "Hi"


def test_sync_client_streams_chunks_and_gathers_a_completion(fake: tuple[str, FakeServicer]) -> None:
    address, _ = fake
    with InferClient(address, timeout_s=10) as client:
        chunks = list(client.generate("Hello", Sampling(max_tokens=2)))
        assert [c.text for c in chunks] == ["Hel", "lo"]
        assert chunks[0].finish_reason is None and chunks[0].usage is None
        assert chunks[1].finish_reason == "stop" and chunks[1].usage is not None
        assert chunks[1].usage.completion_tokens == 2
        assert chunks[1].timings is not None and chunks[1].timings.ttft_s == pytest.approx(0.2)
        completion = client.complete("Hello")
        assert (completion.text, completion.token_ids, completion.finish_reason) == ("Hello", [1, 2], "stop")
        assert client.model_info().model_id == "fake" and client.model_info().kernels == "cpu"
        assert client.tokenize("abc", add_special_tokens=True) == [3, 1]
        assert client.tokenize([{"role": "user", "content": "x"}]) == [1]
        assert client.health() == "SERVING"
        client.wait_until_serving(timeout_s=5)


def test_errors_raise_infer_error_with_the_status_code(fake: tuple[str, FakeServicer]) -> None:
    address, _ = fake
    with InferClient(address, timeout_s=10) as client, pytest.raises(InferError) as info:
        client.complete("invalid")
    assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details == "sampling.top_p: must be in (0, 1]"


def test_leaving_a_stream_early_cancels_the_rpc(fake: tuple[str, FakeServicer]) -> None:
    address, servicer = fake
    servicer.cancelled.clear()
    with InferClient(address) as client:
        stream = client.generate("endless")
        next(stream)
        stream.close()
        assert servicer.cancelled.wait(5)


def test_unreachable_server_is_unavailable() -> None:
    with InferClient("127.0.0.1:1", timeout_s=2) as client, pytest.raises(InferError) as info:
        client.model_info()
    assert info.value.code is grpc.StatusCode.UNAVAILABLE


def test_async_client(fake: tuple[str, FakeServicer]) -> None:
    address, servicer = fake
    servicer.cancelled.clear()

    async def main() -> None:
        async with AsyncInferClient(address, timeout_s=10) as client:
            assert [c.text async for c in client.generate("Hello")] == ["Hel", "lo"]
            assert (await client.complete([1, 2, 3])).text == "Hello"
            assert (await client.model_info()).eos_token_ids == (2,)
            assert await client.tokenize("ab") == [2, 0]
            assert await client.health() == "SERVING"
            await client.wait_until_serving(timeout_s=5)
            with pytest.raises(InferError) as info:
                await client.complete("invalid")
            assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT
            stream = client.generate("endless")
            await stream.__anext__()
            await stream.aclose()

    asyncio.run(main())
    assert servicer.cancelled.wait(5)


def test_optional_sampling_fields_come_from_the_proto() -> None:
    from dataclasses import fields

    from infer.api import OPTIONAL_SAMPLING_FIELDS

    assert set(OPTIONAL_SAMPLING_FIELDS) == {
        "max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
        "frequency_penalty", "seed", "min_tokens", "logprobs", "skip_special_tokens", "speculative_tokens", "priority",
    }  # fmt: skip
    typed = {f.name for f in fields(Sampling)}
    assert set(OPTIONAL_SAMPLING_FIELDS) <= typed  # the typed client offers every one of them


def test_the_async_client_opens_its_channel_in_the_loop_that_uses_it(fake: tuple[str, FakeServicer]) -> None:
    """Made outside any event loop (as the gateway makes it at start), used in one loop, closed, used in another."""
    address, _ = fake
    client = AsyncInferClient(address, timeout_s=10)

    async def ask() -> int:
        try:
            return (await client.model_info()).max_waiting_requests
        finally:
            await client.close()

    assert asyncio.run(ask()) == 8
    assert asyncio.run(ask()) == 8


def test_the_async_client_sends_whole_requests_with_the_caller_s_metadata(fake: tuple[str, FakeServicer]) -> None:
    """What the gateway needs: a GenerateRequest as built (constraint and all), chat messages with tools, and
    the caller's own metadata (its key wins over the client's)."""
    address, servicer = fake
    request = generate_request("Hello", Sampling(max_tokens=2, regex="[a-z]+"), "r-9")
    messages = pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="x"), pb.ChatMessage(role="tool")])
    tool = pb.Tool(name="get_weather", parameters='{"type": "object"}')
    caller = [("authorization", "Bearer caller-key"), ("traceparent", "00-abc-01")]

    async def main() -> None:
        async with AsyncInferClient(address, timeout_s=10, api_key="client-key") as client:
            stream = client.stream(request, metadata=caller)
            texts = []
            while (response := await stream.read()) is not None:
                texts.append(response.text)
            assert texts == ["Hel", "lo"]
            assert servicer.requests[-1] == request
            assert servicer.metadata[-1]["authorization"] == "Bearer caller-key"
            assert servicer.metadata[-1]["traceparent"] == "00-abc-01"
            assert await client.tokenize(messages, tools=[tool], metadata=caller) == [2]
            assert list(servicer.tokenized[-1].tools) == [tool]
            assert servicer.metadata[-1]["authorization"] == "Bearer caller-key"
            assert await client.tokenize("ab") == [2, 0]
            assert servicer.metadata[-1]["authorization"] == "Bearer client-key"
            failing = client.stream(generate_request("invalid", None))
            with pytest.raises(InferError) as info:
                await failing.read()
            assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT

    asyncio.run(main())


def test_unary_calls_have_their_own_deadline(fake: tuple[str, FakeServicer]) -> None:
    address, _ = fake

    async def main() -> None:
        async with AsyncInferClient(address, timeout_s=10, unary_timeout_s=0.2) as client:
            with pytest.raises(InferError) as info:
                await client.tokenize("slow")
            assert info.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
            assert (await client.complete("Hello")).text == "Hello"  # streams keep timeout_s

    asyncio.run(main())
