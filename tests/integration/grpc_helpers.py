"""gRPC servers for integration tests on free 127.0.0.1 ports: in-process (each on its own event-loop thread),
or `infer serve` in a subprocess, as users run it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Coroutine, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from infer.engine.async_engine import AsyncEngine
from infer.engine.config import EngineConfig
from infer.server.app import InferenceServer
from infer.server.settings import ServerConfig
from tests.helpers.engine_state import is_idle
from tests.helpers.fake_engine import fake_core

T = TypeVar("T")


class ServerThread:
    """An InferenceServer served from a background thread, for synchronous tests."""

    def __init__(self, config: ServerConfig, engine: AsyncEngine | None = None) -> None:
        self.spans = InMemorySpanExporter()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-grpc-server", daemon=True)
        self._thread.start()
        self.server: InferenceServer = self.call(self._create(config))
        self.call(self.server.start())
        self.call(self.server.load(engine), timeout_s=300)

    async def _create(self, config: ServerConfig) -> InferenceServer:
        return InferenceServer(config, span_exporter=self.spans)

    def call(self, coro: Coroutine[Any, Any, T], timeout_s: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    @property
    def engine(self) -> AsyncEngine:
        assert isinstance(self.server.engine, AsyncEngine)
        return self.server.engine

    def wait_idle(self, timeout_s: float = 30) -> None:
        """Until the engine holds no request and no KV block."""
        core = self.engine.core
        deadline = time.monotonic() + timeout_s
        while not is_idle(core):
            if time.monotonic() > deadline:
                raise AssertionError(f"engine not idle: {core.stats()}")
            time.sleep(0.02)
        core.block_manager.assert_no_leaks()

    def stop(self, grace_s: float = 5) -> None:
        self.call(self.server.stop(grace_s))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


def engine_config(model_dir: Path, **overrides: Any) -> EngineConfig:
    values: dict[str, Any] = {"model": str(model_dir), "max_model_len": 512, "num_blocks": 512, "max_num_seqs": 32}
    return EngineConfig(**(values | overrides))


@contextlib.contextmanager
def running_fake_server(
    server_settings: dict[str, Any] | None = None, **engine_settings: Any
) -> Iterator[ServerThread]:
    """A server over the fake engine (tests/helpers/fake_engine.py): no weights, starts in milliseconds.
    `server_settings` are ServerConfig fields (limits, ...)."""
    core, _ = fake_core(**engine_settings)
    ports: dict[str, Any] = {"grpc_port": 0, "metrics_port": None, "http_port": None}
    config = ServerConfig(engine=core.config, **(ports | (server_settings or {})))
    server = ServerThread(config, AsyncEngine(core))
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def running_server(model_dir: Path, **engine_overrides: Any) -> Iterator[ServerThread]:
    config = ServerConfig(engine=engine_config(model_dir, **engine_overrides), grpc_port=0, metrics_port=0)
    server = ServerThread(config)
    try:
        yield server
    finally:
        server.stop()


class ServeProcess:
    """`infer serve` in a subprocess on free ports; `log` collects its stderr. `http`: with the OpenAI gateway."""

    def __init__(
        self,
        model_dir: Path,
        *flags: str,
        http: bool = True,
        metrics: bool = False,
        env: Mapping[str, str] | None = None,
    ) -> None:
        cmd = [sys.executable, "-m", "infer", "serve", "--grpc-port", "0", "--model", str(model_dir)]
        cmd += ["--http-port", "0" if http else "off", "--metrics-port", "0" if metrics else "off"]
        cmd += ["--max-model-len", "256", "--num-blocks", "64", *flags]  # NOTE: later flags win
        environ = os.environ | {"PYTHONUNBUFFERED": "1", **(env or {})}
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=environ)
        self.log: list[str] = []
        self.port = self.http_port = self.metrics_port = 0
        self._wanted = {"grpc"} | ({"http"} if http else set()) | ({"metrics"} if metrics else set())
        self._listening = threading.Event()
        threading.Thread(target=self._read_log, daemon=True).start()
        if not self._listening.wait(120):
            self.kill()
            raise AssertionError("no listening address logged:\n" + "".join(self.log))

    def _read_log(self) -> None:
        assert self.proc.stderr is not None
        seen: set[str] = set()
        for line in self.proc.stderr:
            self.log.append(line)
            if m := re.search(r"gRPC listening on [\d.]+:(\d+)", line):
                self.port = int(m.group(1))
                seen.add("grpc")
            if m := re.search(r"OpenAI gateway on http://[\d.]+:(\d+)", line):
                self.http_port = int(m.group(1))
                seen.add("http")
            if m := re.search(r"Prometheus metrics on http://[\d.]+:(\d+)", line):
                self.metrics_port = int(m.group(1))
                seen.add("metrics")
            if seen >= self._wanted:
                self._listening.set()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def wait_for_log(self, text: str, timeout_s: float = 30) -> str:
        """The log so far, once a line holding `text` has been read (health can say SERVING before the reader
        thread has seen the lines logged just before it)."""
        deadline = time.monotonic() + timeout_s
        while not any(text in line for line in self.log):
            assert time.monotonic() < deadline, f"{text!r} not logged:\n" + "".join(self.log)
            time.sleep(0.05)
        return "".join(self.log)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
