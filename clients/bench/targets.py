"""What `infer bench` sends requests to: the gRPC `Generate` stream, or an OpenAI HTTP endpoint (streamed SSE).

Each target sends one request and times it on the client: when it was sent, when each piece of output
arrived, when it ended, how many tokens it produced, and its status ("OK", a gRPC status code name,
"HTTP 429", or an exception's class name).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from infer.clients.bench.workloads import RequestSpec
from infer.clients.client import AsyncInferClient
from infer.clients.types import InferError, Sampling

PROTOCOLS = ("grpc", "completions", "chat")
Json = dict[str, Any]
# chat prompts are text: token ids map onto common words, about one token each (the length is approximate)
_WORD_LIST = (
    "the of and to in is was for on that with as by at from his her an are were which this be had it not but "
    "one all new more time year work first part city world life state house music team group film game water "
    "light river north south west east small great large early late high long"
)
WORDS = tuple(_WORD_LIST.split())


@dataclass
class RequestResult:
    """One request as the client saw it; times in seconds, `sent_s` from the start of the run."""

    index: int
    tag: str
    prompt_tokens: int
    max_tokens: int
    sent_s: float
    status: str = "OK"
    error: str = ""
    ttft_s: float | None = None
    e2e_s: float = 0.0
    output_tokens: int = 0
    gaps_s: list[float] = field(default_factory=list)  # between consecutive output messages

    @property
    def ok(self) -> bool:
        return self.status == "OK"

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first."""
        if self.ttft_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


class Clock:
    """Marks one request's output as it arrives."""

    def __init__(self, result: RequestResult) -> None:
        self.result = result
        self.start = time.perf_counter()
        self.last: float | None = None

    def tokens(self, n: int) -> None:
        if n <= 0:
            return
        now = time.perf_counter()
        if self.last is None:
            self.result.ttft_s = now - self.start
        else:
            self.result.gaps_s.append(now - self.last)
        self.last = now
        self.result.output_tokens += n

    def done(self) -> None:
        self.result.e2e_s = time.perf_counter() - self.start


class Target(Protocol):
    name: str

    async def send(self, spec: RequestSpec, result: RequestResult) -> None: ...

    async def close(self) -> None: ...


class GrpcTarget:
    """`infer.v1.InferenceService/Generate`: one message per step, its token ids counted."""

    def __init__(
        self,
        address: str,
        metadata: Sequence[tuple[str, str]] = (),
        priority: int | None = None,
        max_streams_per_channel: int | None = None,
    ) -> None:
        self.name = f"grpc://{address}"
        # `max_streams_per_channel`: the server's streams per connection, past which another opens (AsyncInferClient)
        self.client = AsyncInferClient(address, max_streams_per_channel=max_streams_per_channel)
        self.metadata, self.priority = tuple(metadata), priority  # sent with every request (e.g. a tenant header)

    async def send(self, spec: RequestSpec, result: RequestResult) -> None:
        clock = Clock(result)
        sampling = Sampling(max_tokens=spec.max_tokens, temperature=0.0, ignore_eos=True, priority=self.priority)
        try:
            async for chunk in self.client.generate(list(spec.prompt), sampling, metadata=self.metadata):
                clock.tokens(len(chunk.token_ids))
        except InferError as e:
            result.status, result.error = e.code.name, e.details
        clock.done()

    async def close(self) -> None:
        await self.client.close()


def prompt_text(ids: Sequence[int]) -> str:
    return " ".join(WORDS[i % len(WORDS)] for i in ids)


class OpenAITarget:
    """An OpenAI-compatible server (infer's gateway, llama.cpp's llama-server): streamed completions or chat.

    A content chunk counts as output; the token count is the usage the server reports at the end
    (`stream_options.include_usage`), else the number of content chunks.
    """

    def __init__(
        self,
        base_url: str,
        protocol: str,
        model: str | None = None,
        extra: Json | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        import httpx  # NOTE: imported here: the gRPC path needs no HTTP client

        self.base_url, self.protocol, self.model = base_url.rstrip("/"), protocol, model
        self.extra = extra or {}  # merged into every request body (server-specific fields)
        self.name = f"{self.base_url} ({protocol})"
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        # `headers`: sent with every request (e.g. a tenant header)
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0), limits=limits, headers=headers)

    async def _model(self) -> str:
        """The model named in requests: given, else the first that GET /models lists."""
        if self.model is None:
            response = await self.http.get(f"{self.base_url}/models")
            response.raise_for_status()
            self.model = str(response.json()["data"][0]["id"])
        return self.model

    def body(self, spec: RequestSpec, model: str) -> Json:
        common = {"model": model, "max_tokens": spec.max_tokens, "temperature": 0.0, "stream": True,
                  "stream_options": {"include_usage": True}, "ignore_eos": True}  # fmt: skip
        if self.protocol == "chat":
            return common | {"messages": [{"role": "user", "content": prompt_text(spec.prompt)}]} | self.extra
        return common | {"prompt": list(spec.prompt)} | self.extra

    @property
    def url(self) -> str:
        path = "chat/completions" if self.protocol == "chat" else "completions"
        return f"{self.base_url}/{path}"

    async def send(self, spec: RequestSpec, result: RequestResult) -> None:
        import httpx

        clock, usage = Clock(result), None
        try:
            body = self.body(spec, await self._model())
            async with self.http.stream("POST", self.url, json=body) as response:
                if response.status_code != 200:
                    answer = (await response.aread()).decode(errors="replace")
                    result.status, result.error = f"HTTP {response.status_code}", answer[:300]
                else:
                    usage = await self._read_events(response.aiter_lines(), clock)
        except httpx.HTTPError as e:
            result.status, result.error = type(e).__name__, str(e)[:300]
        clock.done()
        if result.ok and usage is not None:
            result.output_tokens = int(usage)

    async def _read_events(self, lines: Any, clock: Clock) -> int | None:
        """Mark each content chunk; the completion tokens of the usage chunk, if any."""
        usage = None
        async for line in lines:
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            event = json.loads(data)
            if event.get("usage"):
                usage = event["usage"].get("completion_tokens")
            for choice in event.get("choices") or ():
                text = choice.get("text") if self.protocol != "chat" else (choice.get("delta") or {}).get("content")
                if text:
                    clock.tokens(1)
        return usage

    async def close(self) -> None:
        await self.http.aclose()


def make_target(protocol: str, address: str, model: str | None = None, extra: Json | None = None) -> Target:
    """gRPC: `address` is host:port. completions/chat: the base URL, e.g. http://127.0.0.1:8000/v1;
    `extra` is merged into each HTTP request body."""
    if protocol == "grpc":
        return GrpcTarget(address)
    if protocol in ("completions", "chat"):
        return OpenAITarget(address, protocol, model, extra)
    raise ValueError(f"unknown protocol {protocol!r}: one of {', '.join(PROTOCOLS)}")
