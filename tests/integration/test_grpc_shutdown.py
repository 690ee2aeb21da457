"""`infer serve` in a subprocess: SIGTERM drains (NOT_SERVING, new RPCs refused, in-flight streams finish), exit 0."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from infer.clients import Chunk, InferClient, InferError, Sampling

STREAM = Sampling(max_tokens=64, temperature=0.0, ignore_eos=True)


class ServeProcess:
    def __init__(self, model_dir: Path, *flags: str) -> None:
        cmd = [sys.executable, "-m", "infer", "serve", "--grpc-port", "0", "--http-port", "0", "--metrics-port", "off"]
        cmd += ["--model", str(model_dir), "--max-model-len", "256", "--num-blocks", "64", *flags]
        env = os.environ | {"PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
        self.log: list[str] = []
        self._port = threading.Event()
        self.port = self.http_port = 0
        threading.Thread(target=self._read_log, daemon=True).start()
        if not self._port.wait(120):
            self.proc.kill()
            raise AssertionError("no listening address logged:\n" + "".join(self.log))

    def _read_log(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)
            if m := re.search(r"gRPC listening on [\d.]+:(\d+)", line):
                self.port = int(m.group(1))
            if m := re.search(r"OpenAI gateway on http://[\d.]+:(\d+)", line):
                self.http_port = int(m.group(1))
            if self.port and self.http_port:
                self._port.set()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@pytest.fixture
def serve(default_model_dir: Path) -> Iterator[ServeProcess]:
    server = ServeProcess(default_model_dir, "--shutdown-grace-s", "120")
    yield server
    if server.proc.poll() is None:
        server.proc.kill()
        server.proc.wait(10)


def test_sigterm_drains_then_exits_0(serve: ServeProcess) -> None:
    client = InferClient(serve.address, timeout_s=120)
    client.wait_until_serving(timeout_s=120)
    log = "".join(serve.log)
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
    while client.health() != "NOT_SERVING":
        assert time.monotonic() < deadline, "health never flipped to NOT_SERVING"
        time.sleep(0.02)
    with pytest.raises(InferError) as refused:
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
