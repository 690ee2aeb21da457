"""`infer serve`'s server around a (fake) engine: the in-process gateway's metrics on the metrics port, never on
the public HTTP one; the thread count in the start-up log."""

from __future__ import annotations

import logging

import httpx
import pytest
import torch

from infer.engine.async_engine import AsyncEngine
from infer.server.app import InferenceServer, start_gateway
from infer.server.settings import ServerConfig
from tests.helpers.fake_engine import fake_core
from tests.unit.server.gateway.gateway_helpers import LoopThread


def test_in_process_gateway_metrics_join_the_metrics_port(loop: LoopThread) -> None:
    core, _ = fake_core()
    server = InferenceServer(ServerConfig(engine=core.config, grpc_port=0, http_port=0, metrics_port=0, warmup=False))
    loop.call(server.start())
    gateway = None
    try:
        loop.call(server.load(AsyncEngine(core)))
        gateway = loop.call(start_gateway(server))
        assert gateway is not None
        http = f"http://127.0.0.1:{gateway.port}"
        assert httpx.get(f"{http}/v1/models", timeout=10).status_code == 200
        assert httpx.get(f"{http}/metrics", timeout=10).status_code == 404
        scrape = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
        assert 'infer_gateway_requests_total{endpoint="/v1/models",status="200"} 1.0' in scrape
        assert "infer_requests_waiting 0.0" in scrape  # the engine's, on the same port
    finally:
        if gateway is not None:
            loop.call(gateway.stop())
        loop.call(server.stop(grace_s=0))


def test_the_start_log_names_the_thread_count(
    loop: LoopThread, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """What a pod's OMP_NUM_THREADS (from its CPU request) came to; torch reads it at start-up."""
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    core, _ = fake_core()
    server = InferenceServer(ServerConfig(engine=core.config, grpc_port=0, http_port=None, metrics_port=None))
    loop.call(server.start())
    try:
        with caplog.at_level(logging.INFO, logger="infer.server.app"):
            loop.call(server.load(AsyncEngine(core)))
    finally:
        loop.call(server.stop(grace_s=0))
    assert f"{torch.get_num_threads()} CPU threads (OMP_NUM_THREADS=3)" in caplog.messages
