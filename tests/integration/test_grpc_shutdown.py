"""`infer serve` in a subprocess: SIGTERM drains (GOAWAY, the listener closed, new RPCs refused, in-flight streams
finish), exit 0. (With a second replica, clients move to it: test_grpc_drain.py.)"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from infer.clients import Chunk, InferClient, InferError, Sampling
from tests.integration.grpc_helpers import ServeProcess

STREAM = Sampling(max_tokens=64, temperature=0.0, ignore_eos=True)


@pytest.fixture
def serve(default_model_dir: Path) -> Iterator[ServeProcess]:
    server = ServeProcess(default_model_dir, "--shutdown-grace-s", "120")
    yield server
    server.kill()


def test_sigterm_drains_then_exits_0(serve: ServeProcess) -> None:
    client = InferClient(serve.address, timeout_s=120)
    client.wait_until_serving(timeout_s=120)
    log = serve.wait_for_log("SERVING on")
    assert "model SmolLM2-135M-Instruct" in log and "64 KV blocks" in log and "on cpu" in log

    chunks: list[Chunk] = []
    first = threading.Event()

    def stream() -> None:
        for chunk in client.generate("Tell me a story", STREAM):
            chunks.append(chunk)
            first.set()

    streamer = threading.Thread(target=stream)
    streamer.start()
    assert first.wait(60)
    serve.proc.send_signal(signal.SIGTERM)

    deadline = time.monotonic() + 10
    while _health(client) == "SERVING":  # then GOAWAY: the server takes no new RPC, health checks included
        assert time.monotonic() < deadline, "health never stopped saying SERVING"
        time.sleep(0.02)
    with pytest.raises(InferError) as refused:  # no other replica to go to
        client.complete("Hello", Sampling(max_tokens=2))
    assert refused.value.code is grpc.StatusCode.UNAVAILABLE
    assert not chunks[-1].finish_reason, "the stream should still be running while we check"

    streamer.join(120)
    assert chunks[-1].finish_reason == "length"
    assert sum(len(c.token_ids) for c in chunks) == STREAM.max_tokens
    assert serve.proc.wait(60) == 0
    assert "draining" in "".join(serve.log)


def test_one_command_serves_grpc_and_the_openai_gateway(serve: ServeProcess) -> None:
    InferClient(serve.address, timeout_s=120).wait_until_serving(timeout_s=120)
    body = {"model": "SmolLM2-135M-Instruct", "max_tokens": 12, "temperature": 0,
            "messages": [{"role": "user", "content": "What is the capital of France?"}]}  # fmt: skip
    reply = httpx.post(f"http://127.0.0.1:{serve.http_port}/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    assert "Paris" in reply.json()["choices"][0]["message"]["content"]
    serve.proc.send_signal(signal.SIGINT)  # one Ctrl-C stops both
    assert serve.proc.wait(60) == 0


def _health(client: InferClient) -> str:
    try:
        return client.health()
    except InferError as e:
        return e.code.name
