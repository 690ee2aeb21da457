"""Drain moves clients: a replica that gets SIGTERM sends GOAWAY and turns NOT_SERVING, finishes its streams,
and a client that balances over several replicas sends everything else to the others, none of it failing.

Real `infer serve` subprocesses over a tiny random model (a second to load), as users run them.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from infer.api import pb, pb_grpc
from infer.clients import Chunk, Completion, InferClient, InferError, Sampling
from infer.clients.channel import channel
from infer.engine.async_engine import AsyncEngine
from infer.server.lifecycle import NotServingError
from infer.server.settings import ServerConfig
from tests.helpers.fake_engine import fake_core
from tests.helpers.tiny_models import make_servable_model
from tests.integration.grpc_helpers import ServeProcess, ServerThread, running_fake_server

# NOTE: 16 layers make a decode step take milliseconds, so a 400-token stream is still running at SIGTERM
NUM_LAYERS = 16
STREAM = Sampling(max_tokens=400, temperature=0.0, ignore_eos=True)
SHORT = Sampling(max_tokens=4, temperature=0.0, ignore_eos=True)
FLAGS = ("--max-model-len", "1024", "--num-blocks", "128", "--shutdown-grace-s", "60")
ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # two servers and the test share the CPU


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_servable_model(tmp_path_factory.mktemp("tiny-llama"), num_hidden_layers=NUM_LAYERS)


@pytest.fixture
def replicas(model_dir: Path) -> Iterator[list[ServeProcess]]:
    servers: list[ServeProcess] = []
    try:
        for _ in range(2):  # NOTE: each returns once listening: the two load their model side by side
            servers.append(ServeProcess(model_dir, *FLAGS, http=False, metrics=True, env=ONE_THREAD))
        for server in servers:
            InferClient(server.address).wait_until_serving(timeout_s=120)
        yield servers
    finally:
        for server in servers:
            server.kill()


def _metric(server: ServeProcess, pattern: str) -> float:
    """A sample of the server's Prometheus /metrics (0 when absent)."""
    text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
    m = re.search(rf"^{pattern} ([\d.e+]+)$", text, re.MULTILINE)
    return float(m.group(1)) if m else 0.0


def _generate_ok(server: ServeProcess) -> float:
    return _metric(server, r'infer_requests_total\{code="OK",method="Generate"\}')


def test_sigterm_mid_stream_moves_every_later_call_to_the_other_replica(replicas: list[ServeProcess]) -> None:
    with InferClient("ipv4:" + ",".join(s.address for s in replicas), timeout_s=60) as client:
        chunks: list[Chunk] = []
        first = threading.Event()

        def stream() -> None:
            for chunk in client.generate("Hello", STREAM):
                chunks.append(chunk)
                first.set()

        streamer = threading.Thread(target=stream)
        streamer.start()
        assert first.wait(60)
        draining = next(s for s in replicas if _metric(s, "infer_requests_running") == 1)
        other = next(s for s in replicas if s is not draining)
        draining.proc.send_signal(signal.SIGTERM)

        completions: list[Completion] = []
        while True:  # during the drain: the stream still runs on the draining replica
            completions.append(client.complete("Hello", SHORT))
            if not streamer.is_alive():
                break
        streamer.join(60)
        assert chunks[-1].finish_reason == "length"
        assert sum(len(c.token_ids) for c in chunks) == STREAM.max_tokens
        assert draining.proc.wait(60) == 0
        completions += [client.complete("Hello", SHORT) for _ in range(5)]  # after it is gone

    assert all(c.finish_reason == "length" and len(c.token_ids) == SHORT.max_tokens for c in completions)
    assert _generate_ok(other) == len(completions)  # every one of them on the other replica
    assert "draining: 1 RPCs in flight" in "".join(draining.log)


def test_the_gateway_in_the_same_process_finishes_its_stream(model_dir: Path) -> None:
    server = ServeProcess(model_dir, *FLAGS, env=ONE_THREAD)
    try:
        InferClient(server.address).wait_until_serving(timeout_s=120)
        base = f"http://127.0.0.1:{server.http_port}/v1"
        model = httpx.get(f"{base}/models", timeout=10).json()["data"][0]["id"]
        body = {"model": model, "prompt": "Hello", "max_tokens": STREAM.max_tokens, "temperature": 0,
                "stream": True, "ignore_eos": True}  # fmt: skip
        events: list[str] = []
        with httpx.stream("POST", f"{base}/completions", json=body, timeout=60) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(line.removeprefix("data: "))
                    if len(events) == 1:
                        server.proc.send_signal(signal.SIGTERM)
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
        assert server.proc.wait(60) == 0
    finally:
        server.kill()


def test_calls_racing_a_drain_all_succeed_on_the_other_replica() -> None:
    """Calls that pick the draining replica just as it drains: answered UNAVAILABLE and retried elsewhere, never
    CANCELLED (what grpc answers a call that reaches a server after its GOAWAY; it happened in most drains)."""
    # NOTE: the race is a matter of chance (the client stops sending once health says NOT_SERVING; a call already
    # on its way is refused): drains are repeated until two met it, and every one must lose no call
    rounds_raced = 0
    for _ in range(8):
        num_ok, num_refused, failures = _drain_while_calling(num_callers=16)
        assert not failures and num_ok > 0
        rounds_raced += num_refused > 0
        if rounds_raced == 2:
            break
    assert rounds_raced == 2, "fewer than two of 8 drains met a call: the race did not happen"


def _drain_while_calling(num_callers: int) -> tuple[int, int, list[str]]:
    """Stop one of two replicas while `num_callers` threads call both through one client: (calls ok, calls the
    draining replica refused, failures)."""
    failures: list[str] = []
    num_ok = 0
    stop = threading.Event()
    with running_fake_server() as other:
        draining = ServerThread(other.server.config, AsyncEngine(fake_core()[0]))
        refused = _count_refusals(draining)
        with InferClient(f"ipv4:{draining.address},{other.address}", timeout_s=10) as client:

            def calls() -> None:
                nonlocal num_ok
                while not stop.is_set():
                    try:
                        client.tokenize("Hello")
                        num_ok += 1
                    except InferError as e:
                        failures.append(str(e))

            callers = [threading.Thread(target=calls) for _ in range(num_callers)]
            for caller in callers:
                caller.start()
            stop.wait(0.2)
            draining.stop()
            stop.wait(0.3)
            stop.set()
            for caller in callers:
                caller.join(30)
    return num_ok, len(refused), failures


def _count_refusals(server: ServerThread) -> list[str]:
    """The RPCs `server` refuses because it is not serving (draining), one entry each, as they come."""
    lifecycle = server.server.lifecycle
    plain = lifecycle.in_flight
    refused: list[str] = []

    @contextlib.contextmanager
    def in_flight() -> Iterator[Any]:
        try:
            with plain() as engine:
                yield engine
        except NotServingError as e:
            refused.append(str(e))
            raise

    lifecycle.in_flight = in_flight  # type: ignore[method-assign]
    return refused


def test_a_lone_draining_server_refuses_a_new_stream_within_its_deadline() -> None:
    """No other replica: a stream asked for while the server drains fails UNAVAILABLE (its retries span the
    GOAWAY; a blocking stream retried by gRPC itself then hung past its deadline), the one in flight finishes."""
    core, runner = fake_core()
    server = ServerThread(
        ServerConfig(engine=core.config, grpc_port=0, metrics_port=None, http_port=None), AsyncEngine(core)
    )
    runner.step_s = 0.05  # a 40-token stream: ~2 s
    errors: list[InferError] = []
    with InferClient(server.address, timeout_s=10) as client:
        stream = client.generate("Hello", Sampling(max_tokens=40, temperature=0, ignore_eos=True))
        chunks = [next(stream)]
        stopper = threading.Thread(target=server.stop, kwargs={"grace_s": 30})
        stopper.start()
        while client.health() == "SERVING":
            pass

        def refused() -> None:
            with pytest.raises(InferError) as e:
                client.complete("Hello", SHORT)
            errors.append(e.value)

        caller = threading.Thread(target=refused, daemon=True)
        caller.start()
        caller.join(20)
        assert not caller.is_alive(), "a stream asked for during the drain never returned"
        chunks += list(stream)
        stopper.join(30)
    assert [e.code for e in errors] == [grpc.StatusCode.UNAVAILABLE]
    assert sum(len(c.token_ids) for c in chunks) == 40 and chunks[-1].finish_reason == "length"


def test_max_connection_age_reconnects_a_long_lived_client_without_failing_a_call() -> None:
    core, runner = fake_core()
    config = ServerConfig(
        engine=core.config, grpc_port=0, metrics_port=None, http_port=None, max_connection_age_s=0.2
    )  # NOTE: the age grace stays unbounded: a stream that outlives the age finishes
    server = ServerThread(config, AsyncEngine(core))
    states: list[grpc.ChannelConnectivity] = []
    try:
        with channel(server.address) as ch:
            ch.subscribe(states.append)
            stub = pb_grpc.InferenceServiceStub(ch)  # type: ignore[no-untyped-call]
            runner.step_s = 0.05  # a 12-token stream: ~0.6 s, three connection ages
            request = pb.GenerateRequest(
                prompt="Hello", sampling=pb.SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
            )
            assert sum(len(r.token_ids) for r in stub.Generate(request, timeout=30)) == 12
            runner.step_s = 0.0
            for _ in range(12):  # ~1.2 s of calls: each after a GOAWAY goes over a new connection
                assert stub.Tokenize(pb.TokenizeRequest(text="Hello"), timeout=10).token_ids
                threading.Event().wait(0.1)
    finally:
        server.stop()
    num_connects = states.count(grpc.ChannelConnectivity.READY)
    assert num_connects >= 3, states
