"""What a sloppy or hostile gRPC client gets: a clear INVALID_ARGUMENT, and nobody else notices.

Served over the fake engine (no weights): these are the service's checks, not the model's.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import math
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from infer.api import pb, pb_grpc
from tests.helpers.fake_engine import FakeRunner
from tests.integration.grpc_helpers import ServerThread, running_fake_server

# prompts up to 100,000 characters pass the size check (the derived bound would be 16 x 255), so long
# prompts reach the long lane; at most 2 of them wait to be tokenized
LIMITS = {"max_prompt_chars": 100_000, "max_pending_long_prompts": 2}
LONG_PROMPT = "a long prompt " * 400  # 5600 characters: the long lane


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    with running_fake_server(LIMITS, max_model_len=256) as s:
        yield s


@pytest.fixture
def channel(server: ServerThread) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.address) as ch:
        yield ch


def _error(call: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        list(call) if not isinstance(call, grpc.Future) else call.result()
    return info.value


@pytest.mark.parametrize("method", ["Generate", "GetModelInfo", "Tokenize"])
def test_malformed_protobuf_is_invalid_argument(channel: grpc.Channel, method: str) -> None:
    path = f"/infer.v1.InferenceService/{method}"
    if method == "Generate":
        error = _error(channel.unary_stream(path)(b"\xff\xff\xff", timeout=10))
    else:
        with pytest.raises(grpc.RpcError) as raised:
            channel.unary_unary(path)(b"\xff\xff\xff", timeout=10)
        error = raised.value
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed" in (error.details() or "")


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (pb.GenerateRequest(prompt="hi", request_id="x" * 5000), "request_id: must be 1 to 128 visible ASCII"),
        (pb.GenerateRequest(prompt="hi", request_id="tab\there"), "request_id: must be 1 to 128 visible ASCII"),
        (pb.GenerateRequest(prompt="hi", request_id="newline\n"), "request_id: must be 1 to 128 visible ASCII"),
        (
            pb.GenerateRequest(
                messages=pb.ChatMessages(
                    messages=[pb.ChatMessage(role="user", content="hi"), pb.ChatMessage(role="root", content="obey")]
                )
            ),
            "messages[1].role: 'root' is not one of system, developer, user, assistant",
        ),
        (
            pb.GenerateRequest(prompt="hi", sampling=pb.SamplingParams(stop_token_ids=[10**6])),
            "sampling.stop_token_ids: ids must be in [0, ",
        ),
        (
            pb.GenerateRequest(token_ids=pb.TokenIds(ids=list(range(3, 300)))),
            "prompt: 297 tokens exceeds max_model_len",
        ),
    ],
    ids=[
        "long-request-id",
        "invisible-request-id",
        "newline-request-id",
        "unknown-role",
        "oov-stop-token",
        "prompt-too-long",
    ],
)
def test_bad_requests_are_refused_naming_the_field(
    server: ServerThread, channel: grpc.Channel, request_: pb.GenerateRequest, message: str
) -> None:
    error = _error(pb_grpc.InferenceServiceStub(channel).Generate(request_, timeout=10))  # type: ignore[no-untyped-call]
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert (error.details() or "").startswith(message)
    server.wait_idle()


def test_developer_is_the_system_role(channel: grpc.Channel) -> None:
    stub = pb_grpc.InferenceServiceStub(channel)  # type: ignore[no-untyped-call]

    def rendered(role: str) -> str:
        messages = pb.ChatMessages(messages=[pb.ChatMessage(role=role, content="Be brief.")])
        return str(stub.Tokenize(pb.TokenizeRequest(messages=messages), timeout=10).text)

    assert rendered("developer") == rendered("system")


@dataclass
class HeldEncode:
    """The server's tokenizer, made to hold every encode of LONG_PROMPT until `release` is set."""

    encode: Callable[[str], list[int]]  # the real one
    started: threading.Event  # set when an encode of LONG_PROMPT is held
    release: threading.Event


@pytest.fixture
def held(server: ServerThread, monkeypatch: pytest.MonkeyPatch) -> Iterator[HeldEncode]:
    tokenizer = server.engine.tokenizer
    encode, started, release = tokenizer.encode, threading.Event(), threading.Event()

    def slow_encode(text: str, add_special_tokens: bool = True) -> list[int]:
        if text == LONG_PROMPT:
            started.set()
            release.wait(20)
        return encode(text, add_special_tokens)

    monkeypatch.setattr(tokenizer, "encode", slow_encode)
    try:
        yield HeldEncode(encode, started, release)
    finally:
        release.set()


def test_tokenizing_a_prompt_does_not_stall_other_rpcs(
    server: ServerThread, channel: grpc.Channel, held: HeldEncode
) -> None:
    encode, started, release = held.encode, held.started, held.release
    stub = pb_grpc.InferenceServiceStub(channel)  # type: ignore[no-untyped-call]
    tokenizing = stub.Tokenize.future(pb.TokenizeRequest(text=LONG_PROMPT), timeout=30)
    generating = stub.Generate(pb.GenerateRequest(prompt=LONG_PROMPT), timeout=30)

    def drain() -> None:
        with contextlib.suppress(grpc.RpcError):  # cancelled below, once the test has what it needs
            list(generating)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        assert started.wait(10)
        # both tokenizations are under way: the event loop must still answer others
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        short = list(stub.Generate(pb.GenerateRequest(prompt="hi", sampling=pb.SamplingParams(max_tokens=2)),
                                   timeout=5))  # fmt: skip
        assert sum(len(r.token_ids) for r in short) == 2
    finally:
        release.set()
    assert list(tokenizing.result(timeout=10).token_ids) == encode(LONG_PROMPT)
    generating.cancel()
    reader.join(10)
    server.wait_idle()


def test_a_chat_too_long_is_named_messages(server: ServerThread, channel: grpc.Channel) -> None:
    messages = pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="fox " * 400)])
    stub = pb_grpc.InferenceServiceStub(channel)  # type: ignore[no-untyped-call]
    error = _error(stub.Generate(pb.GenerateRequest(messages=messages), timeout=10))
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert (error.details() or "").startswith("messages: ") and "exceeds max_model_len" in (error.details() or "")


def _generate(stub: pb_grpc.InferenceServiceStub, request: pb.GenerateRequest) -> list[pb.GenerateResponse]:
    return list(stub.Generate(request, timeout=60))


def test_huge_chats_are_refused_before_rendering_and_others_go_on(server: ServerThread, channel: grpc.Channel) -> None:
    # 250,000 empty messages (2 MB): was rendered and tokenized in full (seconds each, in the shared pool)
    huge = pb.GenerateRequest(messages=pb.ChatMessages(messages=[pb.ChatMessage(role="user")] * 250_000))
    stub = pb_grpc.InferenceServiceStub(channel)  # type: ignore[no-untyped-call]
    normal = pb.GenerateRequest(prompt="Hello", sampling=pb.SamplingParams(max_tokens=4, temperature=0))
    with concurrent.futures.ThreadPoolExecutor(7) as pool:
        refused = [pool.submit(_error, stub.Generate(huge, timeout=60)) for _ in range(6)]
        served = pool.submit(_generate, stub, normal)
        assert sum(len(r.token_ids) for r in served.result(60)) == 4
        for future in refused:
            error = future.result(60)
            assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert (error.details() or "").startswith("messages: 250000 messages exceeds max_chat_messages (255; ")
    server.wait_idle()


def test_long_prompts_wait_in_their_own_lane_with_a_bound(
    server: ServerThread, channel: grpc.Channel, held: HeldEncode
) -> None:
    encode, started, release = held.encode, held.started, held.release
    stub = pb_grpc.InferenceServiceStub(channel)  # type: ignore[no-untyped-call]
    long_ones = [stub.Tokenize.future(pb.TokenizeRequest(text=LONG_PROMPT), timeout=30) for _ in range(2)]
    try:
        assert started.wait(10)  # one is tokenizing, the other waits behind it: the bound of 2
        with pytest.raises(grpc.RpcError) as refused:
            stub.Tokenize(pb.TokenizeRequest(text=LONG_PROMPT), timeout=10)
        assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_pending_long_prompts" in (refused.value.details() or "")
        # short prompts have their own lane: served while the long lane is stuck
        short = pb.GenerateRequest(prompt="hi " * 20, sampling=pb.SamplingParams(max_tokens=2, ignore_eos=True))
        assert sum(len(r.token_ids) for r in _generate(stub, short)) == 2
    finally:
        release.set()
    assert all(list(f.result(timeout=10).token_ids) == encode(LONG_PROMPT) for f in long_ones)
    server.wait_idle()


@pytest.mark.parametrize("door", ["prompt", "chat"])
def test_a_tiny_temperature_samples_like_greedy_not_token_zero(channel: grpc.Channel, door: str) -> None:
    stub = pb_grpc.InferenceServiceStub(channel)  # type: ignore[no-untyped-call]

    def tokens(temperature: float) -> list[int]:
        sampling = pb.SamplingParams(max_tokens=6, temperature=temperature, ignore_eos=True, seed=1)
        if door == "prompt":
            request = pb.GenerateRequest(prompt="Hello world", sampling=sampling)
        else:
            chat = pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="Hello world")])
            request = pb.GenerateRequest(messages=chat, sampling=sampling)
        return [t for r in _generate(stub, request) for t in r.token_ids]

    greedy = tokens(0.0)
    assert tokens(1e-300) == greedy and set(greedy) != {0}  # was [0, 0, 0, 0, 0, 0]


@pytest.fixture
def positive_logits(server: ServerThread) -> Iterator[None]:
    """Logits up to 20, as a real model's: a penalty divides the positive ones."""
    runner = server.engine.core.runner
    assert isinstance(runner, FakeRunner)
    runner.logit_offset = 20.0
    yield
    runner.logit_offset = 0.0


@pytest.mark.usefixtures("positive_logits")
def test_a_tiny_repetition_penalty_gives_finite_logprobs(channel: grpc.Channel) -> None:
    stub = pb_grpc.InferenceServiceStub(channel)  # type: ignore[no-untyped-call]
    sampling = pb.SamplingParams(max_tokens=6, repetition_penalty=1e-300, logprobs=5, ignore_eos=True)
    responses = _generate(stub, pb.GenerateRequest(prompt="Hello world, the capital", sampling=sampling))
    values = [v for r in responses for lp in r.logprobs for v in (lp.logprob, *(t.logprob for t in lp.top))]
    assert len(values) == 6 * 6 and all(math.isfinite(v) for v in values)  # were NaN
