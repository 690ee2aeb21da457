"""OpenTelemetry for the server: a span per RPC, and metrics exported in the Prometheus format.

Each server owns its tracer and meter providers (no process-wide globals), and its own
Prometheus registry, so several servers can live in one process (tests do). The registry holds up to two
sets of names (`metric_sets`): infer's own (`infer_*`, through OpenTelemetry) and vLLM's for the
endpoint picker of an inference gateway (`vllm_metrics.py`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, Protocol

from opentelemetry import propagate, trace
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from prometheus_client import CollectorRegistry

from infer.api import SERVICE_NAME
from infer.engine import EngineStats, RequestOutput
from infer.server.metrics_http import start_metrics_server
from infer.server.vllm_metrics import ModelSource, VllmMetrics

logger = logging.getLogger(__name__)

TTFT_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS_S = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
StatsSource = Callable[[], EngineStats | None]


METRIC_SETS = ("infer", "vllm")
# the model-server protocol's gauges (Gateway API Inference Extension) by infer's own Prometheus names;
# the Helm chart's HPA uses them (a picker reads vLLM's names: vllm_metrics.py)
PROTOCOL_GAUGES = {
    "TotalQueuedRequests": "infer_requests_waiting",
    "TotalRunningRequests": "infer_requests_running",
    "KVCacheUtilization": "infer_kv_cache_usage_ratio",
}


class TenantCount(Protocol):
    """What keeps per-tenant state and says how much (server/tenants.py's `Tenants`)."""

    @property
    def num_tracked(self) -> int: ...


class RequestTrace:
    """One RPC: its span, time to first token and inter-token latency; `end` records the outcome."""

    def __init__(self, telemetry: Telemetry, method: str, span: trace.Span) -> None:
        self._telemetry, self.method, self.span = telemetry, method, span
        self.started_s = self._last_token_s = time.monotonic()
        self.num_tokens = 0
        self.is_ended = False
        self.tenant: dict[str, str] | None = None  # the per-tenant metrics' label, once the tenant is known

    # per tenant
    def for_tenant(self, label: str) -> None:
        """Count this request under the tenant label `label` (bounded: `Tenants.label`)."""
        self.tenant = {"tenant": label}

    def on_admitted(self, num_prompt_tokens: int) -> None:
        if self.tenant is not None:
            self._telemetry.tenant_prompt_tokens.add(num_prompt_tokens, self.tenant)

    def on_budget_refused(self) -> None:
        if self.tenant is not None:
            self._telemetry.tenant_budget_refusals.add(1, self.tenant)

    def on_output(self, out: RequestOutput) -> None:
        if out.token_ids:
            self._tokens(len(out.token_ids))
        if out.finished:
            self._finished(out)

    def _tokens(self, num_tokens: int) -> None:
        now, t = time.monotonic(), self._telemetry
        if self.num_tokens == 0:
            t.ttft.record(now - self.started_s)
            self.span.add_event("first_token")
        else:
            for _ in range(num_tokens):
                t.itl.record((now - self._last_token_s) / num_tokens)
        self.num_tokens += num_tokens
        self._last_token_s = now
        if self.tenant is not None:
            t.tenant_generation_tokens.add(num_tokens, self.tenant)

    def _finished(self, out: RequestOutput) -> None:
        attrs: dict[str, Any] = {"infer.finish_reason": str(out.finish_reason)}
        if out.usage is not None:
            attrs |= {
                "infer.usage.prompt_tokens": out.usage.prompt_tokens,
                "infer.usage.completion_tokens": out.usage.completion_tokens,
                "infer.usage.cached_tokens": out.usage.cached_tokens,
            }
        if out.timings is not None:
            attrs |= {"infer.queue_s": out.timings.queue_s, "infer.preemptions": out.timings.num_preemptions}
            if self.tenant is not None:
                self._telemetry.tenant_queue_time.record(out.timings.queue_s, self.tenant)
        self.span.set_attributes(attrs)

    def end(self, code: str, message: str = "") -> None:
        """Record the outcome once: `code` is a gRPC status name (OK, CANCELLED, ...)."""
        if self.is_ended:
            return
        self.is_ended = True
        self.span.set_attribute("rpc.grpc.status_code", code)
        self.span.set_attribute("infer.completion_tokens_streamed", self.num_tokens)
        if code != "OK":
            self.span.set_status(trace.Status(trace.StatusCode.ERROR, f"{code}: {message}"))
        self.span.end()
        self._telemetry.requests.add(1, {"method": self.method, "code": code})
        if self.tenant is not None:
            self._telemetry.tenant_requests.add(1, {**self.tenant, "code": code})
        self._telemetry.duration.record(time.monotonic() - self.started_s, {"method": self.method})


class Telemetry:
    """`metric_sets`: the names the registry exports, of METRIC_SETS; vllm's need `model` (the served model)."""

    def __init__(
        self,
        stats: StatsSource,
        span_exporter: SpanExporter | None = None,
        batch_spans: bool = True,
        *,
        model: ModelSource | None = None,
        metric_sets: Collection[str] = METRIC_SETS,
    ) -> None:
        resource = Resource.create({"service.name": "infer"})
        self.tracer_provider = TracerProvider(resource=resource)
        if span_exporter is not None:
            processor = BatchSpanProcessor if batch_spans else SimpleSpanProcessor
            self.tracer_provider.add_span_processor(processor(span_exporter))
        self.tracer = self.tracer_provider.get_tracer("infer.server")
        self.registry = CollectorRegistry()
        self.is_exporting_own = "infer" in metric_sets
        readers = []
        if self.is_exporting_own:  # NOTE: otherwise the instruments still record, and nothing reads them
            readers.append(
                PrometheusMetricReader(disable_target_info=True, scope_info_enabled=False, registry=self.registry)
            )
        if "vllm" in metric_sets and model is not None:
            self.registry.register(VllmMetrics(stats, model))
        self.meter_provider = MeterProvider(metric_readers=readers, resource=resource)
        self._stats = stats
        self._tenants: TenantCount | None = None
        self._http: Any = None
        self._create_instruments()

    def _create_instruments(self) -> None:
        meter = self.meter_provider.get_meter("infer.server")
        self.requests = meter.create_counter("infer.requests", "{request}", "RPCs by method and final status code")
        self.ttft = meter.create_histogram(
            "infer.time_to_first_token", "s", "RPC start to first token",
            explicit_bucket_boundaries_advisory=TTFT_BUCKETS_S,
        )  # fmt: skip
        self.itl = meter.create_histogram(
            "infer.inter_token_latency", "s", "time between streamed tokens",
            explicit_bucket_boundaries_advisory=ITL_BUCKETS_S,
        )  # fmt: skip
        self.duration = meter.create_histogram(
            "infer.request_duration", "s", "RPC start to end", explicit_bucket_boundaries_advisory=TTFT_BUCKETS_S
        )
        gauges = {
            "infer.requests.waiting": ("{request}", "requests waiting to be scheduled", "num_waiting"),
            "infer.requests.running": ("{request}", "requests running in the engine", "num_running"),
            "infer.kv_blocks.used": ("{block}", "KV-cache blocks in use", "num_blocks_used"),
            "infer.kv_blocks.free": ("{block}", "KV-cache blocks free", "num_blocks_free"),
            "infer.grammar.compiles.pending": ("{compile}", "compiles queued or running", "num_grammars_pending"),
            "infer.cpu_threads": (
                "{thread}",
                "CPU threads the engine steps on (they follow the free cores)",
                "cpu_threads",
            ),
            "infer.cuda_graphs": ("{graph}", "decode batch sizes replayed from CUDA graphs", "cuda_graphs"),
            "infer.cuda_graphs.capture_time": ("s", "the CUDA graphs' capture at start", "cuda_graph_capture_s"),
            "infer.cuda_graphs.memory": ("By", "the CUDA graphs' memory pool", "cuda_graph_memory_bytes"),
        }
        for name, (unit, description, attr) in gauges.items():
            meter.create_observable_gauge(name, [self._observe(attr)], unit, description)
        meter.create_observable_gauge(
            "infer.spec_decode.acceptance_ratio", [self._observe("draft_acceptance_rate")], "1",
            "accepted / verified speculative draft tokens since start",
        )  # fmt: skip
        # NOTE: the protocol's KVCacheUtilization, 0 to 1 (free blocks that still cache a prefix count as free)
        meter.create_observable_gauge(
            "infer.kv_cache.usage_ratio", [self._observe_kv_usage], "1", "fraction of the KV-cache blocks in use"
        )
        counters = {
            "infer.prompt_tokens": ("{token}", "prompt tokens computed", "num_prompt_tokens_total"),
            "infer.generation_tokens": ("{token}", "tokens generated", "num_generation_tokens_total"),
            "infer.prefix_cache_hit_tokens": ("{token}", "prefix-cache hits", "num_cached_tokens_total"),
            "infer.preemptions": ("{preemption}", "requests preempted: KV or policy", "num_preemptions_total"),
            "infer.steps": ("{step}", "engine steps (forward passes)", "num_steps"),
            "infer.step_time": ("s", "engine steps' time (busy, not idle)", "step_s_total"),
            "infer.spec_decode.draft_tokens": ("{token}", "speculative drafts verified", "num_draft_tokens_total"),
            "infer.spec_decode.accepted_tokens": ("{token}", "speculative drafts kept", "num_accepted_tokens_total"),
            "infer.grammar.compiles": ("{compile}", "grammar compiles run", "num_grammars_compiled_total"),
            "infer.grammar.compile_time": ("s", "grammar compile time, trials included", "grammar_compile_s_total"),
            "infer.grammar.refused": ("{constraint}", "refused for compile cost", "num_grammars_refused_total"),
            "infer.kv_events.dropped": ("{event}", "KV-cache events dropped unsent", "num_kv_events_dropped_total"),
            "infer.kv_events.replays_refused": ("{request}", "replays refused or cut", "num_kv_replays_refused_total"),
        }
        for name, (unit, description, attr) in counters.items():
            meter.create_observable_counter(name, [self._observe(attr)], unit, description)
        self._create_tenant_instruments()

    def _create_tenant_instruments(self) -> None:
        """Per tenant, by its label: the tenants the operator's files name, the default one, and "other"."""
        meter = self.meter_provider.get_meter("infer.server")
        self.tenant_requests = meter.create_counter(
            "infer.tenant.requests", "{request}", "Generate RPCs by tenant and final status code"
        )
        self.tenant_prompt_tokens = meter.create_counter(
            "infer.tenant.prompt_tokens", "{token}", "prompt tokens admitted (charged to the budget), by tenant"
        )
        self.tenant_generation_tokens = meter.create_counter(
            "infer.tenant.generation_tokens", "{token}", "tokens generated, by tenant"
        )
        self.tenant_budget_refusals = meter.create_counter(
            "infer.tenant.budget_refusals", "{request}", "requests refused for a spent token budget, by tenant"
        )
        self.tenant_queue_time = meter.create_histogram(
            "infer.tenant.queue_time", "s", "arrival in the engine to first scheduled, by tenant",
            explicit_bucket_boundaries_advisory=TTFT_BUCKETS_S,
        )  # fmt: skip
        meter.create_observable_gauge(
            "infer.tenants.tracked", [self._observe_tenants], "{tenant}",
            "tenants whose state is kept (bounded by max_tenants), by table: scheduler (the fair policy's), budgets",
        )  # fmt: skip

    def track_tenants(self, tenants: TenantCount) -> None:
        """Export how many tenants `tenants` keeps state for (the servicer's token budgets)."""
        self._tenants = tenants

    def _observe(self, attr: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            stats = self._stats()
            return [] if stats is None else [Observation(getattr(stats, attr))]

        return callback

    def _observe_tenants(self, options: CallbackOptions) -> Iterable[Observation]:
        stats = self._stats()
        engine = [] if stats is None else [Observation(stats.num_tenants_tracked, {"table": "scheduler"})]
        server = [] if self._tenants is None else [Observation(self._tenants.num_tracked, {"table": "budgets"})]
        return engine + server

    def _observe_kv_usage(self, options: CallbackOptions) -> Iterable[Observation]:
        stats = self._stats()
        if stats is None or stats.num_blocks_used + stats.num_blocks_free == 0:
            return []
        return [Observation(stats.num_blocks_used / (stats.num_blocks_used + stats.num_blocks_free))]

    def start_request(self, method: str, request_id: str, metadata: Mapping[str, str] | None = None) -> RequestTrace:
        """A span for one RPC, a child of the caller's W3C `traceparent` when it sent one."""
        parent = propagate.extract(dict(metadata or {}))
        span = self.tracer.start_span(
            f"{SERVICE_NAME}/{method}",
            context=parent,
            kind=trace.SpanKind.SERVER,
            attributes={"rpc.system": "grpc", "rpc.method": method, "infer.request_id": request_id},
        )
        return RequestTrace(self, method, span)

    def add_own(self, registry: CollectorRegistry) -> None:
        """Export another registry of infer's own metrics (the in-process gateway's) with these, unless they are off."""
        if self.is_exporting_own:
            self.registry.register(registry)

    def serve_metrics(self, host: str, port: int, header_timeout_s: float = 10.0) -> int:
        """Start the Prometheus HTTP endpoint (bounded like the other doors: `metrics_http.py`); returns its port."""
        self._http = start_metrics_server(self.registry, host, port, header_timeout_s)
        return int(self._http.server_port)

    def shutdown(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


def make_span_exporter(kind: str) -> SpanExporter | None:
    """The span exporter named by `--traces`: none, console (stderr) or otlp (OTEL_EXPORTER_OTLP_* settings)."""
    if kind == "none":
        return None
    if kind == "console":
        import sys

        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter(out=sys.stderr)
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter  # type: ignore[import-not-found]
    except ImportError:
        raise ValueError("traces: otlp needs `pip install opentelemetry-exporter-otlp-proto-grpc`") from None
    exporter: SpanExporter = OTLPSpanExporter()
    return exporter
