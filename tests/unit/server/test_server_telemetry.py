"""Telemetry: a span per request with ids, token counts and finish reason; Prometheus metrics."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from prometheus_client import generate_latest

from infer.engine.request import FinishReason, RequestOutput, Timings, Usage
from infer.engine.stats import EngineStats
from infer.server.telemetry import PROTOCOL_GAUGES, Telemetry
from infer.server.tenants import Tenants, TenantTable

STATS = EngineStats(
    num_waiting=2, num_running=3, num_blocks_used=10, num_blocks_free=90, num_preemptions_total=4,
    num_prompt_tokens_total=100, num_generation_tokens_total=50, num_cached_tokens_total=16,
    tokens_per_s=10.0, queued_tokens=7, num_draft_tokens_total=40, num_accepted_tokens_total=30,
    num_grammars_pending=5, num_grammars_compiled_total=12, num_grammars_refused_total=1, grammar_compile_s_total=2.5,
    cpu_threads=1, num_kv_events_dropped_total=3, num_kv_replays_refused_total=6, num_tenants_tracked=9,
    num_steps=8, step_s_total=1.25,
    cuda_graphs=11, cuda_graph_capture_s=1.5, cuda_graph_memory_bytes=4096,
)  # fmt: skip


@pytest.fixture
def spans() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def telemetry(spans: InMemorySpanExporter) -> Iterator[Telemetry]:
    t = Telemetry(lambda: STATS, spans, batch_spans=False)
    yield t
    t.shutdown()


def _scrape(telemetry: Telemetry) -> str:
    return generate_latest(telemetry.registry).decode()


def test_a_request_span_has_ids_token_counts_and_finish_reason(
    telemetry: Telemetry, spans: InMemorySpanExporter
) -> None:
    trace = telemetry.start_request("Generate", "req-1")
    trace.on_output(RequestOutput("req-1", [5], "a"))
    trace.on_output(RequestOutput("req-1", [6], "b"))
    usage, timings = Usage(3, 3, 0), Timings(0.01, 0.1, 0.3, 0)
    trace.on_output(RequestOutput("req-1", [7], "c", None, FinishReason.LENGTH, usage, timings))
    trace.end("OK")
    trace.end("OK")  # once only
    (span,) = spans.get_finished_spans()
    assert span.name == "infer.v1.InferenceService/Generate"
    assert span.attributes is not None
    assert span.attributes["infer.request_id"] == "req-1"
    assert span.attributes["infer.finish_reason"] == "length"
    assert span.attributes["infer.usage.prompt_tokens"] == 3
    assert span.attributes["infer.usage.completion_tokens"] == 3
    assert span.attributes["rpc.grpc.status_code"] == "OK"
    text = _scrape(telemetry)
    assert "infer_time_to_first_token_seconds_count 1.0" in text
    assert "infer_inter_token_latency_seconds_count 2.0" in text
    assert 'infer_requests_total{code="OK",method="Generate"} 1.0' in text


def test_a_failed_request_marks_its_span_and_counts_its_code(telemetry: Telemetry, spans: InMemorySpanExporter) -> None:
    telemetry.start_request("Generate", "bad").end("INVALID_ARGUMENT", "sampling.top_p: must be in (0, 1]")
    (span,) = spans.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description is not None and "top_p" in span.status.description
    assert 'infer_requests_total{code="INVALID_ARGUMENT",method="Generate"} 1.0' in _scrape(telemetry)


def test_a_span_continues_the_callers_trace(telemetry: Telemetry, spans: InMemorySpanExporter) -> None:
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    traceparent = f"00-{trace_id}-00f067aa0ba902b7-01"
    telemetry.start_request("Generate", "child", {"traceparent": traceparent}).end("OK")
    (span,) = spans.get_finished_spans()
    assert format(span.context.trace_id, "032x") == trace_id


def test_engine_gauges_and_counters_are_exported(telemetry: Telemetry) -> None:
    text = _scrape(telemetry)
    for line in (
        "infer_requests_waiting 2.0", "infer_requests_running 3.0", "infer_kv_blocks_used 10.0",
        "infer_kv_blocks_free 90.0", "infer_preemptions_total 4.0", "infer_prompt_tokens_total 100.0",
        "infer_generation_tokens_total 50.0", "infer_prefix_cache_hit_tokens_total 16.0",
        "infer_kv_cache_usage_ratio 0.1", "infer_spec_decode_draft_tokens_total 40.0",
        "infer_spec_decode_accepted_tokens_total 30.0", "infer_spec_decode_acceptance_ratio 0.75",
        "infer_grammar_compiles_pending 5.0", "infer_grammar_compiles_total 12.0",
        "infer_grammar_compile_time_seconds_total 2.5", "infer_grammar_refused_total 1.0", "infer_cpu_threads 1.0",
        "infer_kv_events_dropped_total 3.0", "infer_kv_events_replays_refused_total 6.0",
        "infer_steps_total 8.0", "infer_step_time_seconds_total 1.25",
        "infer_cuda_graphs 11.0", "infer_cuda_graphs_capture_time_seconds 1.5", "infer_cuda_graphs_memory_bytes 4096.0",
    ):  # fmt: skip
        assert line in text, line


def test_the_tenants_tracked_are_exported_by_table(telemetry: Telemetry) -> None:
    assert 'infer_tenants_tracked{table="scheduler"} 9.0' in _scrape(telemetry)
    tenants = Tenants(table=TenantTable({}, default_tokens_per_minute=60))
    for tenant in ("a", "b"):
        tenants.budgets.charge(tenant, 1)
    telemetry.track_tenants(tenants)
    assert 'infer_tenants_tracked{table="budgets"} 2.0' in _scrape(telemetry)


def test_the_model_server_protocol_gauges_are_exported_by_their_names(telemetry: Telemetry) -> None:
    """What an inference gateway's endpoint picker and the chart's HPA read: queue depth and KV utilisation."""
    lines = _scrape(telemetry).splitlines()
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in lines if not line.startswith("#")}
    assert [values[PROTOCOL_GAUGES[g]] for g in ("TotalQueuedRequests", "TotalRunningRequests")] == [2, 3]
    assert values[PROTOCOL_GAUGES["KVCacheUtilization"]] == pytest.approx(10 / 100)
    assert f"# TYPE {PROTOCOL_GAUGES['KVCacheUtilization']} gauge" in lines


def test_no_engine_yet_exports_no_engine_metrics(spans: InMemorySpanExporter) -> None:
    telemetry = Telemetry(lambda: None, spans)
    try:
        text = _scrape(telemetry)
        assert "infer_kv_blocks_used" not in text and "infer_kv_cache_usage_ratio" not in text
    finally:
        telemetry.shutdown()


def test_metrics_endpoint_serves_prometheus_text(telemetry: Telemetry) -> None:
    port = telemetry.serve_metrics("127.0.0.1", 0)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert "infer_kv_blocks_free 90.0" in response.read().decode()
