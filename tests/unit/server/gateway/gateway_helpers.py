"""Gateways for tests: served by uvicorn on a free 127.0.0.1 port from an event-loop thread; a fake gRPC upstream."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
import httpx
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from infer.api import ERROR_REASON_KEY, INVALID_FIELD_KEY, ErrorReason, pb, pb_grpc
from infer.server.gateway import GatewayConfig, GatewayServer

T = TypeVar("T")
FAKE_MODEL = "fake-model"
FAKE_EOS_TOKEN_IDS = (1, 106)  # Gemma 3's <eos> and <end_of_turn>
FAKE_MAX_MODEL_LEN = 64
FAKE_MAX_WAITING = 100  # the fake server's queue bound (max_waiting_requests)
FAKE_WORDS = ("Hello", " world", ",", " how", " are", " you", "?", "!")


class LoopThread:
    """An asyncio loop running in a daemon thread; `call` runs a coroutine there and waits for it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-gateway-loop", daemon=True)
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, T], timeout_s: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@dataclass
class RunningGateway:
    server: GatewayServer
    loop: LoopThread

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"


@contextlib.contextmanager
def running_gateway(upstream: str, loop: LoopThread, **config: Any) -> Iterator[RunningGateway]:
    values: dict[str, Any] = {"upstream": upstream, "http_port": 0, "shutdown_grace_s": 1.0}
    server = GatewayServer(GatewayConfig(**(values | config)))
    loop.call(server.start())
    try:
        yield RunningGateway(server, loop)
    finally:
        loop.call(server.stop())


@contextlib.contextmanager
def gateway_client(upstream: str, timeout_s: float = 60) -> Iterator[httpx.Client]:
    """An HTTP client of a gateway over `upstream` on a loop thread of its own; all of it stopped on the way out."""
    loop = LoopThread()
    try:
        with running_gateway(upstream, loop) as gateway, httpx.Client(base_url=gateway.url, timeout=timeout_s) as c:
            yield c
    finally:
        loop.close()


def first_model(http: httpx.Client) -> str:
    """The id of the first model the gateway lists."""
    return str(http.get("/v1/models").json()["data"][0]["id"])


_WEATHER_CALL = pb.ToolCallDelta(index=0, id="call_a", name="get_weather", arguments='{"city": ')
TOOL_CALL_RESPONSES: list[dict[str, Any]] = [
    {"token_ids": [1], "text": "Sure."},
    {"token_ids": [2], "tool_calls": [_WEATHER_CALL]},
    {"token_ids": [3], "tool_calls": [pb.ToolCallDelta(index=0, arguments='"Paris"}'),
                                      pb.ToolCallDelta(index=1, id="call_b", name="get_time", arguments="{}")],
     "finish_reason": pb.FINISH_REASON_TOOL_CALLS, "usage": pb.Usage(prompt_tokens=5, completion_tokens=3)},
]  # fmt: skip


def _choice_key(request: pb.GenerateRequest) -> str:
    if request.HasField("choice_index"):
        return f"{request.request_id}#{request.choice_index}"
    return request.request_id


def _prompt_text(request: pb.GenerateRequest) -> str:
    if request.WhichOneof("input") == "messages":
        return request.messages.messages[-1].content
    return request.prompt


def _logprobs(token_id: int, word: str, num_top: int) -> pb.TokenLogprob:
    top = [pb.TopLogprob(token_id=token_id + k, logprob=-0.5 * (k + 1), token=f"{word}{k}") for k in range(num_top)]
    return pb.TokenLogprob(token_id=token_id, logprob=-0.5 if token_id else float("-inf"), token=word, top=top)


@dataclass
class FakeInference(pb_grpc.InferenceServiceServicer):
    """Scripted answers, by prompt (or the last chat message):

    - `status:CODE[/REASON][:details]`: fail at once with that gRPC status code and ErrorReason (INVALID_ARGUMENT's
      default: INVALID_VALUE, as the real servicer sends for a bad value);
    - `fail-midway`: two messages, then INTERNAL;
    - `endless`: one word every 20 ms until cancelled;
    - `nan-logprobs`: NaN logprobs (what a sampler that underflowed would send);
    - `tool-calls`: some text, then TOOL_CALLS (two calls, the first one's arguments in two deltas);
    - anything else: max_tokens words of FAKE_WORDS (default 4), one per message, then usage.
    """

    requests: list[pb.GenerateRequest] = field(default_factory=list)
    metadata: list[dict[str, str]] = field(default_factory=list)
    cancelled: set[str] = field(default_factory=set)  # request ids, `<id>#<choice_index>` for a choice
    num_prompt_tokens: int = 5
    num_tokenize_calls: int = 0

    async def Generate(  # noqa: N802
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> None:
        # NOTE: writes instead of yielding, like the real servicer: a cancel always surfaces here at once
        self.requests.append(request)
        self.metadata.append({k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)})
        prompt = _prompt_text(request)
        if prompt.startswith("status:"):
            _, status, *details = prompt.split(":", 2)
            name, _, reason = status.partition("/")
            message = details[0] if details else f"fake {name}"
            # like the real servicer: the reason, and INVALID_ARGUMENT's field, in the trailing metadata
            field = message.split(":")[0] if name == "INVALID_ARGUMENT" and ":" in message else None
            reason = reason or (ErrorReason.INVALID_VALUE if name == "INVALID_ARGUMENT" else "")
            trailing = ((INVALID_FIELD_KEY, field),) if field else ()
            trailing += ((ERROR_REASON_KEY, reason),) if reason else ()
            await context.abort(grpc.StatusCode[name], message, trailing_metadata=trailing)
        try:
            async for response in self._stream(request, prompt):
                await context.write(response)
        except asyncio.CancelledError:
            self.cancelled.add(_choice_key(request))
            raise
        except Exception:
            if context.cancelled():  # the write failed because the client is gone
                self.cancelled.add(_choice_key(request))
            raise
        if prompt == "fail-midway":
            await context.abort(grpc.StatusCode.INTERNAL, "fake engine failure")

    async def _stream(self, request: pb.GenerateRequest, prompt: str) -> AsyncIterator[pb.GenerateResponse]:
        if prompt == "tool-calls":
            for response in TOOL_CALL_RESPONSES:
                yield pb.GenerateResponse(request_id=request.request_id, **response)
            return
        s = request.sampling
        num_tokens = 2 if prompt == "fail-midway" else 10**6 if prompt == "endless" else s.max_tokens or 4
        for i in range(num_tokens):
            word = FAKE_WORDS[i % len(FAKE_WORDS)]
            response = pb.GenerateResponse(request_id=request.request_id, token_ids=[i], text=word)
            if s.HasField("logprobs"):
                response.logprobs.append(_logprobs(i, word, s.logprobs))
                if prompt == "nan-logprobs":
                    for lp in (response.logprobs[-1], *response.logprobs[-1].top):
                        lp.logprob = float("nan")
            if i == num_tokens - 1 and prompt != "fail-midway":
                response.finish_reason = pb.FINISH_REASON_LENGTH
                response.usage.CopyFrom(pb.Usage(prompt_tokens=self.num_prompt_tokens, completion_tokens=num_tokens))
            if prompt == "endless":
                await asyncio.sleep(0.02)
            yield response

    async def GetModelInfo(  # noqa: N802
        self, request: pb.GetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetModelInfoResponse:
        return pb.GetModelInfoResponse(
            model_id=FAKE_MODEL,
            max_model_len=FAKE_MAX_MODEL_LEN,
            vocab_size=100,
            max_waiting_requests=FAKE_MAX_WAITING,
            eos_token_ids=FAKE_EOS_TOKEN_IDS,
        )

    async def Tokenize(  # noqa: N802
        self, request: pb.TokenizeRequest, context: grpc.aio.ServicerContext
    ) -> pb.TokenizeResponse:
        self.num_tokenize_calls += 1
        return pb.TokenizeResponse(token_ids=list(range(self.num_prompt_tokens)))


class FakeUpstream:
    """A grpc.aio server with FakeInference and grpc.health.v1 on a free 127.0.0.1 port."""

    def __init__(self) -> None:
        self.servicer = FakeInference()
        self.health = health.aio.HealthServicer()
        self.port = 0
        self._server: grpc.aio.Server | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        server = grpc.aio.server()
        pb_grpc.add_InferenceServiceServicer_to_server(self.servicer, server)  # type: ignore[no-untyped-call]
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        self.port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        self._server = server
        await self.set_serving(True)

    async def set_serving(self, is_serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if is_serving else health_pb2.HealthCheckResponse.NOT_SERVING
        await self.health.set("infer.v1.InferenceService", status)

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(None)


# requests and responses

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def completion_body(**fields: Any) -> dict[str, Any]:
    return {"model": FAKE_MODEL, "prompt": "Hi", "max_tokens": 3} | fields


def chat_body(**fields: Any) -> dict[str, Any]:
    return {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "Hi"}]} | fields


def error_of(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return dict(error)


def sse_data(response: httpx.Response) -> list[str]:
    """The `data:` payloads of an SSE body, checking the framing on the way."""
    text = response.text
    assert text.endswith("\n\n")
    events = text[:-2].split("\n\n")
    assert all(e.startswith("data: ") and "\n" not in e for e in events), text
    return [e.removeprefix("data: ") for e in events]


def wait_for(condition: Callable[[], bool], timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
