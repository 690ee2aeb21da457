"""The endpoint picker's metrics: a running server's /metrics, read as an Inference Extension picker reads it.

The expected names, types and labels are written out here from their sources, not from infer's code:
- the model-server protocol: kubernetes-sigs/gateway-api-inference-extension,
  docs/proposals/003-model-server-protocol/README.md at commit 84436a96b9e6ce2b59ddacd3d04c31b4fbd442de
  (2026-08-18): the gauges, their vLLM names, `block_size` / `num_gpu_blocks` labels of `vllm:cache_config_info`,
  and `vllm:lora_requests_info` (value: a timestamp; labels `max_lora`, `running_lora_adapters`,
  `waiting_lora_adapters`);
- llm-d's router: llm-d/llm-d-router, pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go
  (`defaultEngineConfigs`, engine "vllm", the default for a pod without the `llm-d.ai/engine-type` label) and
  extractor.go (the label names it parses) at commit ebab687927f5331c1b39defcb579a07951bce56c
  (v0.10.0-rc.1-62, 2026-08-22).
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator

import grpc
import httpx
import pytest
from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from infer.api import pb, pb_grpc
from infer.engine.stats import EngineStats
from infer.server.app import start_gateway
from infer.server.settings import ServerConfig
from infer.server.telemetry import Telemetry
from infer.server.vllm_metrics import ServedModel
from tests.helpers.fake_engine import FakeRunner
from tests.integration.grpc_helpers import ServerThread, running_fake_server

# the router's default (vLLM) mapping: the spec strings of factories.go, by the protocol's metric
ROUTER_DEFAULT_VLLM = {
    "TotalQueuedRequests": "vllm:num_requests_waiting",  # QueuedRequestsSpec
    "TotalRunningRequests": "vllm:num_requests_running",  # RunningRequestsSpec
    "KVCacheUtilization": "vllm:kv_cache_usage_perc",  # KVUsageSpec
    "LoRA": "vllm:lora_requests_info",  # LoRASpec
    "CacheInfo": "vllm:cache_config_info",  # CacheInfoSpec
}
CACHE_INFO_LABELS = ("block_size", "num_gpu_blocks")  # extractor.go's defaults for CacheInfoSpec
LORA_INFO_LABELS = ("max_lora", "running_lora_adapters", "waiting_lora_adapters")  # extractor.go, the protocol
BLOCK_SIZE, NUM_BLOCKS = 16, 64


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    with running_fake_server({"metrics_port": 0}, block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS) as s:
        yield s


def _scrape(server: ServerThread) -> dict[str, Metric]:
    url = f"http://127.0.0.1:{server.server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        return {family.name: family for family in text_string_to_metric_families(response.read().decode())}


def _value(family: Metric) -> float:
    (sample,) = family.samples
    return float(sample.value)


def _labels(family: Metric) -> dict[str, str]:
    (sample,) = family.samples
    return dict(sample.labels)


def test_the_router_default_engine_names_are_gauges_with_their_labels(server: ServerThread) -> None:
    families = _scrape(server)
    for name in ROUTER_DEFAULT_VLLM.values():
        assert name in families, name
        assert families[name].type == "gauge", name  # the protocol: Gauge (extractValue reads gauges)
    for name in ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"):
        assert _labels(families[name]) == {"model_name": "fake", "engine": "0"}
    cache = _labels(families[ROUTER_DEFAULT_VLLM["CacheInfo"]])
    assert [cache[k] for k in CACHE_INFO_LABELS] == [str(BLOCK_SIZE), str(NUM_BLOCKS)]
    assert _value(families[ROUTER_DEFAULT_VLLM["CacheInfo"]]) == 1
    lora = families[ROUTER_DEFAULT_VLLM["LoRA"]]
    assert _labels(lora) == {"max_lora": "0", "running_lora_adapters": "", "waiting_lora_adapters": ""}
    assert set(LORA_INFO_LABELS) == set(_labels(lora))
    assert _value(lora) > 1e9  # a Unix timestamp: the picker keeps the series with the latest


def test_the_picker_gauges_agree_with_infers_own_while_a_request_runs(server: ServerThread) -> None:
    runner = server.engine.core.runner
    assert isinstance(runner, FakeRunner)
    runner.step_s = 0.05  # 200 steps: the request runs for seconds, and is cancelled once scraped
    sampling = pb.SamplingParams(max_tokens=200, ignore_eos=True)
    with grpc.insecure_channel(server.address) as channel:
        call = pb_grpc.InferenceServiceStub(channel).Generate(pb.GenerateRequest(prompt="Hello", sampling=sampling))
        try:
            while server.engine.stats().num_running == 0:  # published after its first step
                time.sleep(0.01)
            families = _scrape(server)
        finally:
            call.cancel()
            runner.step_s = 0.0
    assert _value(families["vllm:num_requests_running"]) == _value(families["infer_requests_running"]) == 1
    assert _value(families["vllm:num_requests_waiting"]) == _value(families["infer_requests_waiting"]) == 0
    assert 0 < _value(families["vllm:kv_cache_usage_perc"]) <= 1
    assert 0 < _value(families["infer_kv_cache_usage_ratio"]) <= 1
    server.wait_idle()


STATS = EngineStats(num_waiting=2, num_running=3, num_blocks_used=10, num_blocks_free=90, num_preemptions_total=0,
                    num_prompt_tokens_total=0, num_generation_tokens_total=0, num_cached_tokens_total=0,
                    tokens_per_s=0.0, queued_tokens=0)  # fmt: skip
MODEL = ServedModel("m", 32, True, 1.8e9)


@pytest.mark.parametrize(
    ("sets", "has_infer", "has_vllm"), [("infer,vllm", True, True), ("infer", True, False), ("vllm", False, True)]
)
def test_metrics_sets_turns_either_set_off(sets: str, has_infer: bool, has_vllm: bool) -> None:
    telemetry = Telemetry(lambda: STATS, model=lambda: MODEL, metric_sets=ServerConfig(metrics_sets=sets).metric_sets)
    try:
        text = generate_latest(telemetry.registry).decode()
    finally:
        telemetry.shutdown()
    assert ("infer_requests_waiting 2.0" in text) is has_infer
    assert ('vllm:num_requests_waiting{engine="0",model_name="m"} 2.0' in text) is has_vllm
    assert ('vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.1' in text) is has_vllm


def test_no_model_yet_exports_no_picker_gauges() -> None:
    telemetry = Telemetry(lambda: None, model=lambda: None)
    try:
        assert "vllm:" not in generate_latest(telemetry.registry).decode()
    finally:
        telemetry.shutdown()


@pytest.mark.parametrize("sets", ["", "prometheus", "infer,sglang"])
def test_an_unknown_metrics_set_is_refused(sets: str) -> None:
    with pytest.raises(ValueError, match="metrics_sets"):
        ServerConfig(metrics_sets=sets)


@pytest.mark.parametrize("http_metrics", [True, False])
def test_http_metrics_serves_the_same_metrics_on_the_http_port_without_a_key(http_metrics: bool) -> None:
    """Where a picker scrapes by default: the pool's target port (the OpenAI HTTP port), `/metrics`."""
    settings = {"metrics_port": 0, "http_port": 0, "http_metrics": http_metrics, "api_key": "secret-key"}
    with running_fake_server(settings) as server:
        gateway = server.call(start_gateway(server.server))
        assert gateway is not None
        try:
            response = httpx.get(f"http://127.0.0.1:{gateway.port}/metrics", timeout=10)
        finally:
            server.call(gateway.stop())
    if not http_metrics:
        assert response.status_code == 404  # not served on the HTTP port
        return
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(response.text)}
    assert {"vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "infer_requests_waiting"} <= set(families)
    assert "infer_gateway_requests" in families  # the in-process gateway's own, as on the metrics port
