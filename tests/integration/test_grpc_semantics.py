"""Status codes and cleanup: invalid input, queue full, cancel and disconnect, deadlines, engine failures.

Every test ends with the engine idle and no KV block leaked.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from infer.api import INVALID_FIELD_KEY, pb, pb_grpc
from infer.engine.core import EngineCore
from infer.engine.scheduler import SchedulerOutput
from tests.integration.grpc_helpers import ServerThread, running_server

MAX_WAITING = 3
LONG = pb.SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)
SHORT = pb.SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def server(default_model_dir: Path) -> Iterator[ServerThread]:
    with running_server(default_model_dir, max_waiting_requests=MAX_WAITING, max_num_seqs=4, num_blocks=256) as s:
        yield s


@pytest.fixture
def stub(server: ServerThread) -> Iterator[pb_grpc.InferenceServiceStub]:
    with grpc.insecure_channel(server.address) as channel:
        yield pb_grpc.InferenceServiceStub(channel)
    server.wait_idle()  # every test: no request left, no KV block leaked


@contextlib.contextmanager
def paused(core: EngineCore) -> Iterator[None]:
    """Hold the engine thread before its next step; requests pile up in its inbox meanwhile."""
    resume = threading.Event()
    step = core.step

    def held_step() -> bool:
        resume.wait()
        return step()

    core.step = held_step  # type: ignore[method-assign]
    try:
        yield
    finally:
        del core.step  # type: ignore[method-assign]
        resume.set()


@contextlib.contextmanager
def paused_in_forward(core: EngineCore) -> Iterator[None]:
    """Hold the engine inside its next forward pass: the requests it scheduled stay uncomputed."""
    resume = threading.Event()
    step = core.runner.step

    def held_step(work: Any, batch: Any) -> Any:
        resume.wait()
        return step(work, batch)

    core.runner.step = held_step  # type: ignore[method-assign]
    try:
        yield
    finally:
        del core.runner.step  # type: ignore[method-assign]
        resume.set()


@contextlib.contextmanager
def scheduled_ids(core: EngineCore) -> Iterator[set[str]]:
    """Every request id the scheduler gives tokens to while inside."""
    seen: set[str] = set()
    schedule = core.scheduler.schedule

    def recording(now_s: float) -> SchedulerOutput:
        out = schedule(now_s)
        seen.update(out.num_scheduled_tokens)
        return out

    core.scheduler.schedule = recording  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        del core.scheduler.schedule  # type: ignore[method-assign]


def wait_for(condition: Callable[[], bool], timeout_s: float = 30, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def error_of(call: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        for _ in call:
            pass
    return info.value


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (pb.GenerateRequest(prompt="Hi", sampling=pb.SamplingParams(top_p=0.0)), "sampling.top_p"),
        (pb.GenerateRequest(prompt="Hi", sampling=pb.SamplingParams(temperature=-1)), "sampling.temperature"),
        (pb.GenerateRequest(prompt="Hi", sampling=pb.SamplingParams(logprobs=21)), "sampling.logprobs"),
        (pb.GenerateRequest(prompt="Hi", sampling=pb.SamplingParams(max_tokens=10_000)), "sampling.max_tokens"),
        (pb.GenerateRequest(prompt="Hi", sampling=pb.SamplingParams(stop_token_ids=[-1])), "sampling.stop_token_ids"),
        (pb.GenerateRequest(sampling=SHORT), "input"),
        (pb.GenerateRequest(prompt=""), "prompt"),
        (pb.GenerateRequest(token_ids=pb.TokenIds(ids=[1, 10**8])), "token_ids"),
        (pb.GenerateRequest(messages=pb.ChatMessages()), "messages"),
        (pb.GenerateRequest(messages=pb.ChatMessages(messages=[pb.ChatMessage(role="root")])), "messages[0].role"),
        (pb.GenerateRequest(prompt="Hi", tools=[pb.Tool(name="a b")]), "tools[0].name"),
    ],
)
def test_invalid_input_is_invalid_argument_naming_the_field(
    stub: pb_grpc.InferenceServiceStub, request_: pb.GenerateRequest, field: str
) -> None:
    error = error_of(stub.Generate(request_, timeout=30))
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith(f"{field}:"), error.details()
    assert (INVALID_FIELD_KEY, field) in (error.trailing_metadata() or ())  # the field, apart from the message


def test_tokenize_without_input_is_invalid_argument(stub: pb_grpc.InferenceServiceStub) -> None:
    with pytest.raises(grpc.RpcError) as info:
        stub.Tokenize(pb.TokenizeRequest(), timeout=10)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "input" in info.value.details()


def test_full_queue_is_resource_exhausted_at_once(server: ServerThread, stub: pb_grpc.InferenceServiceStub) -> None:
    core = server.engine.core
    with paused(core):
        queued = [stub.Generate(pb.GenerateRequest(prompt=f"Q{i}", sampling=SHORT), timeout=120) for i in range(3)]
        wait_for(lambda: core.num_queued == MAX_WAITING, what="a full queue")
        started = time.monotonic()
        error = error_of(stub.Generate(pb.GenerateRequest(prompt="One too many", sampling=SHORT), timeout=30))
        assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_waiting_requests" in error.details()
        assert time.monotonic() - started < 5
    # the queued ones run once the engine goes on
    assert all(list(call)[-1].finish_reason == pb.FINISH_REASON_LENGTH for call in queued)


def _abort_recorder(core: EngineCore, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """request id -> the engine's step count when its abort arrived."""
    aborted: dict[str, int] = {}
    abort = core.abort

    def recording(request_id: str) -> None:
        aborted[request_id] = core.num_steps
        abort(request_id)

    monkeypatch.setattr(core, "abort", recording)
    return aborted


def test_client_cancel_aborts_and_frees_blocks_within_one_step(
    server: ServerThread, stub: pb_grpc.InferenceServiceStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = server.engine.core
    aborted = _abort_recorder(core, monkeypatch)
    call = stub.Generate(pb.GenerateRequest(prompt="Tell me a story", sampling=LONG, request_id="cancel-me"))
    for i, _ in enumerate(call):
        if i == 2:
            break
    assert core.block_manager.num_used_blocks > 0
    call.cancel()
    wait_for(lambda: not core.is_in_flight("cancel-me"), what="the abort")
    assert core.num_steps - aborted["cancel-me"] <= 1  # freed at the start of the next step
    assert core.block_manager.num_used_blocks == 0


def test_client_disconnect_aborts_the_request(
    server: ServerThread, stub: pb_grpc.InferenceServiceStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = server.engine.core
    aborted = _abort_recorder(core, monkeypatch)
    script = (
        "import sys\n"
        "from infer.clients import InferClient, Sampling\n"
        f"client = InferClient('{server.address}')\n"
        "for chunk in client.generate('Tell me a story', Sampling(max_tokens=200, temperature=0, ignore_eos=True),"
        " request_id='disconnect-me'):\n"
        "    print('token', flush=True)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "token\n"
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # no goodbye: the connection just drops
        proc.wait(10)
    wait_for(lambda: "disconnect-me" in aborted and not core.is_in_flight("disconnect-me"), what="the abort")
    assert core.block_manager.num_used_blocks == 0


def test_request_still_waiting_at_its_deadline_never_runs(
    server: ServerThread, stub: pb_grpc.InferenceServiceStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = server.engine.core
    aborted = _abort_recorder(core, monkeypatch)
    monkeypatch.setattr(core, "predict_ttft_s", lambda num_prompt_tokens: 0.0)  # admitted whatever the load
    with scheduled_ids(core) as seen:
        with paused(core):
            request = pb.GenerateRequest(prompt="Too late", sampling=SHORT, request_id="late")
            error = error_of(stub.Generate(request, timeout=1.0))
            assert error.code() is grpc.StatusCode.DEADLINE_EXCEEDED
            wait_for(lambda: "late" in aborted, what="the abort to reach the engine")
        server.wait_idle()
    assert "late" not in seen


def test_deadline_shorter_than_the_predicted_ttft_is_refused_at_admission(
    server: ServerThread, stub: pb_grpc.InferenceServiceStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    deadline_s = 10.0  # NOTE: long enough for a loaded machine to answer at all (0.5 s flaked)
    core = server.engine.core
    assert core.stats().tokens_per_s > 0  # measured by the warm-up
    # the prefill rate of a slow machine: the 900 queued tokens then take a minute, far past the deadline. Admission
    # reads the snapshot the engine published after its last step, so the idle engine's snapshot gets the rate
    # too (no step publishes another while the forward pass below is held; the test passed only when a step of an
    # earlier test happened to end after the counter was set)
    server.wait_idle()
    monkeypatch.setattr(core.counters.prefill_throughput, "tokens_per_s", 15.0)
    core.inbox.publish(dataclasses.replace(core.inbox.stats(), prefill_tokens_per_s=15.0))
    long_prompt = pb.TokenIds(ids=[100 + i % 1000 for i in range(450)])
    with paused_in_forward(core):
        with paused(core):  # both in the inbox, then both scheduled into the held forward pass
            queued = [stub.Generate(pb.GenerateRequest(token_ids=long_prompt, sampling=SHORT)) for _ in range(2)]
            wait_for(lambda: core.num_queued == 2, what="two queued requests")
        wait_for(lambda: core.stats().queued_tokens == 2 * 450, what="the queued work to be scheduled")
        assert core.predict_ttft_s(4) > 2 * deadline_s
        started = time.monotonic()
        error = error_of(stub.Generate(pb.GenerateRequest(prompt="Quick?", sampling=SHORT), timeout=deadline_s))
        assert error.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        assert "predicted time to first token" in error.details()  # refused at admission, not timed out
        assert time.monotonic() - started < deadline_s
        for call in queued:
            call.cancel()


def test_engine_failure_fails_only_its_request(
    server: ServerThread, stub: pb_grpc.InferenceServiceStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    poison = 4242
    core = server.engine.core
    step = core.runner.step

    def flaky(work: Any, batch: Any) -> Any:
        if any(poison in w.token_ids for w in work):
            raise RuntimeError("poisoned batch")
        return step(work, batch)

    monkeypatch.setattr(core.runner, "step", flaky)
    prompts = ([1, 2, 3], [5, poison, 6], [7, 8])
    with paused(core):  # one batch for all three
        calls = [stub.Generate(pb.GenerateRequest(token_ids=pb.TokenIds(ids=p), sampling=SHORT)) for p in prompts]
        wait_for(lambda: core.num_queued == 3, what="three queued requests")
    error = error_of(calls[1])
    assert error.code() is grpc.StatusCode.INTERNAL
    assert "poisoned batch" in error.details()
    for call in (calls[0], calls[2]):
        responses = list(call)
        assert responses[-1].finish_reason == pb.FINISH_REASON_LENGTH
        assert sum(len(r.token_ids) for r in responses) == SHORT.max_tokens
