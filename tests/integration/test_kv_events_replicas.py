"""The precise prefix-cache routing contract (issue 29): two `infer serve --kv-events` replicas, and a subscriber
that plays llm-d's precise scorer from their events alone. For a new prompt it picks the replica holding the
longest prefix of it, and that replica then reports exactly that prefix as a cache hit; the other reports none.
A test of the contract, not a router: real subprocesses over a tiny random model, on 127.0.0.1."""

from __future__ import annotations

import random
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from infer.clients import InferClient, Sampling
from tests.helpers.kv_events import BlockIndex, Subscriber
from tests.helpers.tiny_models import SERVABLE_VOCAB, make_servable_model
from tests.integration.grpc_helpers import ServeProcess

BLOCK_SIZE = 16
SHORT = Sampling(max_tokens=4, temperature=0.0, ignore_eos=True)
EVENTS = (
    "--kv-events",
    "--kv-events-endpoint",
    "tcp://127.0.0.1:*",
    "--kv-events-replay-endpoint",
    "tcp://127.0.0.1:*",
)
ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # two servers and the test share the CPU
LOGGED = re.compile(r"KV-cache events on (tcp://\S+) \(replay (tcp://\S+)\), topic (\S+)")


class Pod:
    """A replica, and what the scorer knows of it: its events, live or replayed."""

    def __init__(self, server: ServeProcess) -> None:
        self.server, self.client = server, InferClient(server.address, timeout_s=60)
        self.client.wait_until_serving(timeout_s=120)
        m = LOGGED.search(server.wait_for_log("KV-cache events on"))
        assert m is not None
        self.topic = m.group(3)
        self.events = Subscriber(m.group(1), m.group(2))

    def index(self) -> BlockIndex:
        """The pod's blocks from every batch it has published so far (the gaps filled from its replay socket)."""
        self.events.read_live(50)
        batches = self.events.batches
        self.events.replay(min(seq for seq in range(len(batches) + 1) if seq not in batches))
        return self.events.index()

    def score(self, token_ids: list[int], expect_at_least: int = 0, timeout_s: float = 30) -> int:
        """Blocks of token_ids the pod holds, from its events; waits (bounded) until at least `expect_at_least`
        (its events leave on the pod's own thread, after the step that stored the blocks)."""
        deadline = time.monotonic() + timeout_s
        while (n := self.index().longest_prefix(token_ids)) < expect_at_least:
            assert time.monotonic() < deadline, f"{self.topic}: {n} blocks of the prompt in its events"
            time.sleep(0.05)
        return n

    def close(self) -> None:
        self.events.close()
        self.client.close()
        self.server.kill()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_servable_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture
def pods(model_dir: Path) -> Iterator[list[Pod]]:
    servers = [
        ServeProcess(model_dir, *EVENTS, "--kv-events-pod-id", name, http=False, env=ONE_THREAD)
        for name in ("pod-a", "pod-b")
    ]
    pods: list[Pod] = []
    try:
        pods = [Pod(server) for server in servers]
        yield pods
    finally:
        for pod in pods:
            pod.close()
        for server in servers:
            server.kill()


def test_the_scorer_picks_the_replica_that_then_reports_the_prefix_cache_hit(pods: list[Pod], model_dir: Path) -> None:
    a, b = pods
    assert (a.topic, b.topic) == (f"kv@pod-a@{model_dir.name}", f"kv@pod-b@{model_dir.name}")
    rng = random.Random(0)

    def ids(n: int) -> list[int]:
        return [rng.randrange(3, SERVABLE_VOCAB) for _ in range(n)]

    docs = {a: ids(4 * BLOCK_SIZE + 5), b: ids(3 * BLOCK_SIZE + 9)}  # a shared context each replica has seen
    for pod, doc in docs.items():
        pod.client.complete(doc + ids(3), SHORT)
        pod.score(doc, expect_at_least=len(doc) // BLOCK_SIZE)

    for owner, doc in docs.items():
        prompt = doc + ids(7)  # a new question on that context
        scores = {pod: pod.score(prompt) for pod in pods}
        chosen = max(pods, key=lambda pod: scores[pod])
        other = a if chosen is b else b
        assert chosen is owner and scores[chosen] == len(doc) // BLOCK_SIZE and scores[other] == 0
        hit = chosen.client.complete(prompt, SHORT).usage
        miss = other.client.complete(prompt, SHORT).usage
        assert hit is not None and miss is not None
        assert hit.cached_tokens == scores[chosen] * BLOCK_SIZE  # the prefix the events promised, all of it
        assert miss.cached_tokens == 0

    a.server.proc.send_signal(signal.SIGTERM)  # the publisher closes with the engine
    assert a.server.proc.wait(60) == 0
    assert "Traceback" not in "".join(a.server.log)
