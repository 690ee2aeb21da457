"""The gRPC service on the default model: same text as the offline API, usage, concurrency, telemetry."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

import grpc
import pytest

from infer.api import pb, pb_grpc
from infer.clients import AsyncInferClient, Sampling
from infer.engine.llm import LLM
from infer.engine.sampling_params import SamplingParams
from tests.integration.grpc_helpers import ServerThread

PROMPTS = ("Hello, my name is", "The capital of France is", "def fibonacci(n):")
GREEDY = pb.SamplingParams(max_tokens=12, temperature=0.0)


@pytest.fixture(scope="module")
def offline_outputs(default_model_dir: Path) -> list[tuple[list[int], str]]:
    """The offline API's greedy answers (its engine is dropped before the streaming tests run)."""
    llm = LLM(str(default_model_dir), max_model_len=512, num_blocks=128)
    outs = [llm.generate(p, SamplingParams(max_tokens=12, temperature=0.0))[0] for p in PROMPTS]
    return [(o.token_ids, o.text) for o in outs]


def _stream(stub: pb_grpc.InferenceServiceStub, request: pb.GenerateRequest) -> list[pb.GenerateResponse]:
    return list(stub.Generate(request, timeout=120))


def test_streaming_text_equals_the_offline_api(
    grpc_server: ServerThread, stub: pb_grpc.InferenceServiceStub, offline_outputs: list[tuple[list[int], str]]
) -> None:
    for prompt, (token_ids, text) in zip(PROMPTS, offline_outputs, strict=True):
        responses = _stream(stub, pb.GenerateRequest(prompt=prompt, sampling=GREEDY))
        assert [t for r in responses for t in r.token_ids] == token_ids
        assert "".join(r.text for r in responses) == text
        assert all(r.finish_reason == pb.FINISH_REASON_UNSPECIFIED for r in responses[:-1])
        assert all(not r.HasField("usage") for r in responses[:-1])
    grpc_server.wait_idle()


def test_usage_and_finish_reason_are_right(grpc_server: ServerThread, stub: pb_grpc.InferenceServiceStub) -> None:
    prompt = "Count slowly: one, two, three, four, five, six, seven, eight, nine, ten"
    num_prompt_tokens = len(grpc_server.engine.core.tokenizer.encode(prompt))
    sampling = pb.SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    first, second = (_stream(stub, pb.GenerateRequest(prompt=prompt, sampling=sampling)) for _ in range(2))
    last = first[-1]
    assert last.finish_reason == pb.FINISH_REASON_LENGTH
    assert last.usage.prompt_tokens == num_prompt_tokens
    assert last.usage.completion_tokens == sum(len(r.token_ids) for r in first) == 8
    assert 0 < last.timings.ttft_s <= last.timings.total_s
    # the same prompt again: its full blocks come from the prefix cache
    assert second[-1].usage.cached_tokens == (num_prompt_tokens - 1) // 16 * 16 > 0
    grpc_server.wait_idle()


def test_chat_messages_stop_at_eos(grpc_server: ServerThread, stub: pb_grpc.InferenceServiceStub) -> None:
    messages = pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="What is the capital of France?")])
    request = pb.GenerateRequest(messages=messages, sampling=pb.SamplingParams(max_tokens=24, temperature=0.0))
    responses = _stream(stub, request)
    assert "".join(r.text for r in responses).strip() == "The capital of France is Paris."
    assert responses[-1].finish_reason == pb.FINISH_REASON_STOP


def test_logprobs_stream_with_each_token(grpc_server: ServerThread, stub: pb_grpc.InferenceServiceStub) -> None:
    tokenizer = grpc_server.engine.core.tokenizer
    sampling = pb.SamplingParams(max_tokens=4, temperature=0.0, logprobs=3)
    responses = _stream(stub, pb.GenerateRequest(prompt="Hello", sampling=sampling, request_id="with-logprobs"))
    assert all(r.request_id == "with-logprobs" for r in responses)
    for r in responses:
        assert [lp.token_id for lp in r.logprobs] == list(r.token_ids)
        for lp in r.logprobs:
            assert lp.logprob <= 0 and len(lp.top) == 3
            assert lp.top[0].token_id == lp.token_id  # greedy: the sampled token is the best one
            assert lp.token == tokenizer.decode([lp.token_id], skip_special_tokens=False)


def test_32_concurrent_streams_all_finish(grpc_server: ServerThread) -> None:
    async def main() -> list[tuple[str, int, str | None]]:
        async with AsyncInferClient(grpc_server.address, timeout_s=300) as client:
            sampling = Sampling(max_tokens=8, temperature=0.0, ignore_eos=True)
            outs = await asyncio.gather(*(client.complete(f"Story number {i}:", sampling) for i in range(32)))
            return [(o.request_id, len(o.token_ids), o.finish_reason) for o in outs]

    results = asyncio.run(main())
    assert len({rid for rid, _, _ in results}) == 32
    assert all(n == 8 and reason == "length" for _, n, reason in results)
    grpc_server.wait_idle()


def test_model_info_and_tokenize(grpc_server: ServerThread, stub: pb_grpc.InferenceServiceStub) -> None:
    core = grpc_server.engine.core
    info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
    assert info.model_id == "SmolLM2-135M-Instruct"
    assert (info.max_model_len, info.vocab_size) == (512, 49152)
    assert set(info.eos_token_ids) == set(core.eos_token_ids) and info.has_chat_template
    assert info.kernels == core.runner.model.kernels.name and info.kernels in ("torch", "cpu")  # as loaded
    assert list(stub.Tokenize(pb.TokenizeRequest(text="Hello world"), timeout=10).token_ids) == core.tokenizer.encode(
        "Hello world"
    )
    messages = pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="Hi")])
    chat = stub.Tokenize(pb.TokenizeRequest(messages=messages), timeout=10)
    assert list(chat.token_ids) == core.tokenizer.encode_chat([{"role": "user", "content": "Hi"}])
    assert chat.text.endswith("<|im_start|>assistant\n")


def test_health_is_serving(grpc_server: ServerThread) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(grpc_server.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "infer.v1.InferenceService"):
            response = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert response.status == health_pb2.HealthCheckResponse.SERVING


def test_each_request_has_a_span_with_ids_tokens_and_finish_reason(
    grpc_server: ServerThread, stub: pb_grpc.InferenceServiceStub
) -> None:
    _stream(stub, pb.GenerateRequest(prompt="Hi", request_id="traced", sampling=pb.SamplingParams(max_tokens=3)))
    spans = [s for s in grpc_server.spans.get_finished_spans() if s.attributes.get("infer.request_id") == "traced"]
    assert len(spans) == 1
    attrs = spans[0].attributes
    assert spans[0].name == "infer.v1.InferenceService/Generate"
    assert attrs["rpc.grpc.status_code"] == "OK"
    assert attrs["infer.usage.prompt_tokens"] == 1 and attrs["infer.usage.completion_tokens"] >= 1
    assert attrs["infer.finish_reason"] in ("stop", "length")


def test_metrics_are_exported_for_prometheus(grpc_server: ServerThread, stub: pb_grpc.InferenceServiceStub) -> None:
    _stream(stub, pb.GenerateRequest(prompt="Hi", sampling=pb.SamplingParams(max_tokens=3)))
    with urllib.request.urlopen(f"http://127.0.0.1:{grpc_server.server.metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    for name in (
        "infer_requests_waiting", "infer_requests_running", "infer_kv_blocks_used", "infer_kv_blocks_free",
        "infer_time_to_first_token_seconds_bucket", "infer_inter_token_latency_seconds_bucket",
        "infer_prompt_tokens_total", "infer_generation_tokens_total", "infer_preemptions_total",
        'infer_requests_total{code="OK",method="Generate"}',
    ):  # fmt: skip
        assert name in text, name
    assert "infer_kv_blocks_free 512.0" in text
