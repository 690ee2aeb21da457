"""The model-server protocol's gauges under vLLM's names: what an Inference Extension endpoint picker reads.

The Gateway API Inference Extension's protocol (docs/proposals/003-model-server-protocol) fixes the metrics a
picker scrapes, by meaning and type; llm-d's router maps them to names per engine and, for a pod with no
`llm-d.ai/engine-type` label, reads vLLM's (pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go).
infer exports them under those names, beside its own `infer_*`, so a pool of infer pods needs no picker flags:

| protocol | name here | type | value and labels |
|---|---|---|---|
| TotalQueuedRequests | `vllm:num_requests_waiting` | gauge | requests waiting; `model_name`, `engine` |
| TotalRunningRequests | `vllm:num_requests_running` | gauge | requests running; `model_name`, `engine` |
| KVCacheUtilization | `vllm:kv_cache_usage_perc` | gauge | KV blocks in use, 0 to 1; `model_name`, `engine` |
| BlockSize, NumGPUBlocks | `vllm:cache_config_info` | gauge | 1; `block_size`, `num_gpu_blocks`, ... |
| LoRA adapters | `vllm:lora_requests_info` | gauge | the time it was set; `max_lora` 0, adapter lists empty |
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from infer.engine import EngineStats

ENGINE_INDEX = "0"  # NOTE: vLLM labels each engine core of a server; infer has one


@dataclass(frozen=True)
class ServedModel:
    """What the gauges say of the model a server runs, fixed once it is loaded."""

    model_name: str  # the name clients send (vLLM's served model name)
    block_size: int  # tokens per KV block
    enable_prefix_caching: bool
    loaded_s: float  # wall-clock time the model was loaded: the LoRA gauge's value (the picker keeps the latest)


ModelSource = Callable[[], ServedModel | None]
StatsSource = Callable[[], EngineStats | None]


class VllmMetrics(Collector):
    """A Prometheus collector reading the engine's snapshot at each scrape; nothing before a model is loaded."""

    def __init__(self, stats: StatsSource, model: ModelSource) -> None:
        self._stats, self._model = stats, model

    def collect(self) -> Iterator[Metric]:
        stats, model = self._stats(), self._model()
        if stats is None or model is None:
            return
        labels = {"model_name": model.model_name, "engine": ENGINE_INDEX}
        num_blocks = stats.num_blocks_used + stats.num_blocks_free
        usage = stats.num_blocks_used / num_blocks if num_blocks else 0.0
        yield _gauge("vllm:num_requests_waiting", "requests waiting to be scheduled", labels, stats.num_waiting)
        yield _gauge("vllm:num_requests_running", "requests running in the engine", labels, stats.num_running)
        yield _gauge("vllm:kv_cache_usage_perc", "fraction of the KV-cache blocks in use (0 to 1)", labels, usage)
        cache = {
            "block_size": str(model.block_size),
            "num_gpu_blocks": str(num_blocks),
            "enable_prefix_caching": str(model.enable_prefix_caching),
            "engine": ENGINE_INDEX,
        }
        yield _gauge("vllm:cache_config_info", "the KV cache's configuration, in its labels", cache, 1.0)
        # NOTE: no adapters yet: max_lora 0 and empty lists say so (the picker reads the series of the latest value)
        lora = {"max_lora": "0", "running_lora_adapters": "", "waiting_lora_adapters": ""}
        yield _gauge("vllm:lora_requests_info", "LoRA adapters, in its labels (none yet)", lora, model.loaded_s)


def _gauge(name: str, documentation: str, labels: dict[str, str], value: float) -> GaugeMetricFamily:
    gauge = GaugeMetricFamily(name, documentation, labels=list(labels))
    gauge.add_metric(list(labels.values()), float(value))
    return gauge
