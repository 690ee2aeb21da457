"""KV-cache events (engine/kv_events.py): what a subscriber rebuilds from them is exactly what the prefix cache
holds, in vLLM's wire format; a slow subscriber, a stalled publisher thread and a late subscriber never stall
the step; events off cost nothing. Sockets on 127.0.0.1, free ports."""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import zmq

from infer.engine import kv_events, kv_replay
from infer.engine.config import EngineConfig
from infer.engine.core import EngineCore
from infer.engine.kv_events import KVEventPublisher, is_bind, topic, wire_hash
from infer.engine.request import FinishReason, RequestOutput
from infer.engine.sampling_params import SamplingParams
from tests.helpers.fake_engine import fake_core
from tests.helpers.kv_events import END_SEQ, BlockIndex, Subscriber, to_signed

LOCAL = "tcp://127.0.0.1:*"
PROBE = 1 << 40
LIVE_BOUND_S = 1.0  # a live batch published during a replay burst arrives within this (unloaded: a millisecond)
EVENTS = {"kv_events": True, "kv_events_endpoint": LOCAL, "kv_events_replay_endpoint": LOCAL}
# a pool of 20 blocks of 16 under up to 8 requests of up to 128 tokens: preemptions and evictions
SMALL_POOL = {"max_model_len": 128, "num_blocks": 20, "max_num_seqs": 8, "speculative_tokens": 2}


@pytest.fixture
def core() -> Iterator[EngineCore]:
    core, _ = fake_core(**EVENTS, **SMALL_POOL)
    yield core
    core.close()


def _subscriber(pub: KVEventPublisher | None, **options: Any) -> Subscriber:
    assert pub is not None
    return Subscriber(pub.endpoint, pub.replay_endpoint, **options)


def _subscribed(pub: KVEventPublisher, sub: Subscriber) -> None:
    """Publish a probe (a block stored and removed at once) until the subscriber reads one live."""
    for _ in range(300):
        pub.block_stored(PROBE, None, [0] * pub.block_size)
        pub.block_removed(PROBE)
        pub.end_step()
        if sub.read_live(100):
            return
    raise AssertionError("the subscription never took")


class Workload:
    """Random requests over three shared prefixes (prefix hits), with aborts, on a small pool (preemptions,
    evictions); greedy and seeded sampling mixed."""

    def __init__(self, core: EngineCore, seed: int) -> None:
        self.core, self.rng = core, random.Random(seed)
        self.bases = [[self.rng.randrange(3, 300) for _ in range(64)] for _ in range(3)]
        self.live: set[str] = set()
        self.num_added = self.num_aborted = 0

    def run(self, num_requests: int) -> None:
        last = self.num_added + num_requests
        while self.num_added < last or self.core.has_work:
            if self.num_added < last and self.rng.random() < 0.5:
                self._add()
            if self.live and self.rng.random() < 0.08:
                self.core.abort(self.rng.choice(sorted(self.live)))
            self.core.step()

    def _add(self) -> None:
        rng, rid = self.rng, f"r{self.num_added}"
        prompt = rng.choice(self.bases)[: rng.choice((0, 16, 20, 32, 48, 64))]
        prompt += [rng.randrange(3, 300) for _ in range(rng.randrange(1, 17))]
        seed = rng.choice((None, rng.randrange(1000)))
        params = SamplingParams(max_tokens=rng.randrange(1, 40), temperature=0.0 if seed is None else 1.0, seed=seed,
                                ignore_eos=True)  # fmt: skip
        self.live.add(rid)
        self.core.add_request(rid, prompt, params, self._sink)
        self.num_added += 1

    def _sink(self, out: RequestOutput) -> None:
        if out.finish_reason is not None:
            self.live.discard(out.request_id)
            self.num_aborted += out.finish_reason is FinishReason.ABORT


def _cached(core: EngineCore) -> dict[int, tuple[int, ...]]:
    """The prefix cache's blocks as published: hash -> tokens."""
    bm = core.block_manager
    return {wire_hash(h): bm.blocks[block_id].token_ids for h, block_id in bm.cached.items()}


def _assert_rebuilt(index: BlockIndex, core: EngineCore) -> None:
    assert {h: tokens for h, (_, tokens) in index.blocks.items()} == _cached(core)
    for h, (parent, tokens) in index.blocks.items():  # the cache's own hashes: of the parent's hash and the tokens
        assert to_signed(h) == hash((None if parent is None else to_signed(parent), tokens))


def test_a_subscriber_rebuilds_exactly_the_blocks_the_prefix_cache_holds(core: EngineCore) -> None:
    sub = _subscriber(core.kv_events)
    try:
        workload = Workload(core, seed=1)
        workload.run(60)
        assert core.kv_events is not None
        sub.catch_up(core.kv_events.last_seq)
        index = sub.index()
    finally:
        sub.close()
    _assert_rebuilt(index, core)
    stats = core.stats()
    # the workload did what it is for
    assert stats.num_preemptions_total > 0 and stats.num_cached_tokens_total > 0 and workload.num_aborted > 0
    assert index.num_removed > 0  # evictions
    assert len(index.blocks) > 0
    assert sub.topics == {topic(None, "fake").encode()}
    assert stats.num_kv_events_dropped_total == 0
    core.block_manager.assert_no_leaks()


def test_a_late_subscriber_recovers_the_earlier_batches_through_the_replay_socket(core: EngineCore) -> None:
    workload = Workload(core, seed=2)
    workload.run(20)
    sub = _subscriber(core.kv_events)
    try:
        for _ in range(100):  # until its subscription is in: requests that store blocks
            workload.run(1)
            if sub.read_live(100):
                break
        workload.run(20)
        assert core.kv_events is not None
        sub.catch_up(core.kv_events.last_seq)
        index = sub.index()
    finally:
        sub.close()
    assert sub.live_seqs and 0 not in sub.live_seqs and 0 in sub.batches  # live from its start, earlier replayed
    _assert_rebuilt(index, core)
    core.block_manager.assert_no_leaks()


def test_a_replay_from_a_batch_no_longer_held_sends_what_is_held_then_the_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kv_replay, "REPLAY_BATCHES", 3)
    pub = KVEventPublisher(LOCAL, LOCAL, "kv@pod@model", 16)
    sub = _subscriber(pub)
    try:
        for i in range(6):  # batches 1-6 after the first (0: AllBlocksCleared)
            pub.block_removed(i)
            pub.end_step()
        deadline = time.monotonic() + 30
        while (held := sub.replay(1)) != [4, 5, 6]:  # 1 is gone: what is held (once sent), then the end marker
            assert time.monotonic() < deadline, held
        assert sub.replay(5) == [5, 6]
        assert sub.replay(7) == []  # not yet published
        assert sub.replay(b"not 8 bytes") == []  # malformed: the end marker alone
    finally:
        sub.close()
        pub.close()


def test_a_subscriber_that_never_reads_stalls_neither_the_step_nor_the_publisher_and_replays_its_gap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kv_events, "SEND_HWM", 8)
    pub = KVEventPublisher(LOCAL, LOCAL, "kv@pod@model", 4096)
    slow = _subscriber(pub, rcvhwm=1, rcvbuf=4096)
    try:
        _subscribed(pub, slow)  # from now on it reads nothing
        num_batches = 600  # ~7 MB: more than the socket buffers between the two hold
        for i in range(num_batches):  # the step: never waits
            pub.block_stored(i + 1, i or None, [40_000 + i] * 4096)
            pub.end_step()
        last = pub.last_seq
        probe = _subscriber(pub)
        deadline = time.monotonic() + 60
        while probe.replay(0)[-1:] != [last]:  # the publisher thread sent every batch: none waited on `slow`
            assert time.monotonic() < deadline
        probe.close()
        assert pub.num_dropped == 0
        slow.read_live(0)  # what ZMQ kept for it: a gap where it dropped for this subscriber alone
        assert len(slow.batches) < last + 1
        slow.catch_up(last)  # filled from the replay socket
        index = slow.index()
    finally:
        slow.close()
        pub.close()
    assert sorted(index.blocks) == list(range(1, num_batches + 1))
    assert index.blocks[num_batches] == (num_batches - 1, (40_000 + num_batches - 1,) * 4096)


def test_a_stalled_publisher_thread_drops_the_oldest_batches_and_the_step_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kv_events, "QUEUE_BATCHES", 4)
    entered, release = threading.Event(), threading.Event()
    send = KVEventPublisher._send

    def stalled(self: KVEventPublisher, seq: int, ts: float, events: list[list[Any]]) -> None:
        if seq == 0:
            entered.set()
            release.wait(60)
        send(self, seq, ts, events)

    monkeypatch.setattr(KVEventPublisher, "_send", stalled)
    core, _ = fake_core(**EVENTS, **SMALL_POOL)
    try:
        assert entered.wait(30)  # the thread holds batch 0 and sends nothing more
        sub = _subscriber(core.kv_events)
        workload = Workload(core, seed=3)
        workload.run(40)  # every step runs
        dropped = core.stats().num_kv_events_dropped_total
        assert dropped > 0
        release.set()
        assert core.kv_events is not None
        sub.catch_up(core.kv_events.last_seq)
        seqs = sorted(sub.batches)
        sub.close()
        assert core.stats().num_kv_events_dropped_total == dropped
    finally:
        release.set()
        core.close()
    first_after_gap = next(seq for prev, seq in itertools.pairwise(seqs) if seq != prev + 1)
    assert msgpack.unpackb(sub.batches[first_after_gap])[1][0] == ["AllBlocksCleared"]
    index = BlockIndex(strict=False)
    for seq in seqs:  # what a subscriber keeps after the loss: a subset of what the pod holds, never more
        index.apply(sub.batches[seq])
    assert {h: tokens for h, (_, tokens) in index.blocks.items()}.items() <= _cached(core).items()
    core.block_manager.assert_no_leaks()


class Burst:
    """Replay requests for batch `start` from several DEALERs at once, on a thread that reads every answer: the
    seqs of each, in the order they came, per DEALER."""

    def __init__(self, endpoint: str, num_dealers: int, num_requests: int, start: int = 0) -> None:
        self.endpoint, self.num_requests, self.start = endpoint, num_requests, start
        self.answers: list[list[list[int]]] = [[] for _ in range(num_dealers)]
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    @property
    def is_done(self) -> bool:
        return all(len(answers) == self.num_requests for answers in self.answers)

    def _run(self) -> None:
        ctx = zmq.Context()
        dealers = [ctx.socket(zmq.DEALER) for _ in self.answers]
        poller, index = zmq.Poller(), {}
        for i, dealer in enumerate(dealers):
            dealer.connect(self.endpoint)
            poller.register(dealer, zmq.POLLIN)
            index[dealer] = i
        for _ in range(self.num_requests):
            for dealer in dealers:
                dealer.send_multipart([b"", self.start.to_bytes(8, "big")])
        current: list[list[int]] = [[] for _ in dealers]
        while not self.stopped.is_set() and not self.is_done:
            for dealer, _ in poller.poll(20):
                i = index[dealer]
                while dealer.poll(0):
                    _, _, seq_bytes, _ = dealer.recv_multipart()
                    seq = int.from_bytes(seq_bytes, "big")
                    if seq == END_SEQ:
                        self.answers[i].append(current[i])
                        current[i] = []
                    else:
                        current[i].append(seq)
        ctx.destroy(linger=0)

    def close(self) -> None:
        self.stopped.set()
        self.thread.join(10)


def _fill(pub: KVEventPublisher, sub: Subscriber, num_batches: int, num_tokens: int = 0) -> None:
    """Publish num_batches batches (a block of num_tokens each, or a removal) and wait until the thread sent all."""
    for i in range(num_batches):
        if num_tokens:
            pub.block_stored(i + 1, i or None, [40_000 + i] * num_tokens)
        else:
            pub.block_removed(i)
        pub.end_step()
    deadline = time.monotonic() + 30
    while sub.replay(pub.last_seq) != [pub.last_seq]:
        assert time.monotonic() < deadline


def _live_delay(pub: KVEventPublisher, sub: Subscriber) -> float:
    """Publish a live batch and read it: the seconds it took to arrive (at most LIVE_BOUND_S)."""
    started = time.monotonic()
    pub.block_removed(PROBE)
    pub.end_step()
    seq = pub.last_seq
    while seq not in sub.batches:
        assert time.monotonic() - started < LIVE_BOUND_S, "a live batch waited behind the replays"
        sub.read_live(10)
    return time.monotonic() - started


def test_a_burst_of_replay_requests_never_delays_live_events_and_each_request_gets_its_end_marker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kv_replay, "REPLAY_ANSWER_BATCHES", 100)
    monkeypatch.setattr(kv_replay, "REPLAY_ACTIVE", 4)
    monkeypatch.setattr(kv_replay, "REPLAY_TURN_MESSAGES", 16)
    pub = KVEventPublisher(LOCAL, LOCAL, "kv@pod@model", 16)
    sub = _subscriber(pub)
    burst = None
    try:
        _fill(pub, sub, 2_000)
        _subscribed(pub, sub)
        burst = Burst(pub.replay_endpoint or "", num_dealers=8, num_requests=50)  # 400 requests for the whole ring
        delays = []
        while not burst.is_done:  # live batches go on arriving at once (today's code: seconds behind)
            delays.append(_live_delay(pub, sub))
        delays.append(_live_delay(pub, sub))
    finally:
        if burst is not None:
            burst.close()
        sub.close()
        pub.close()
    answers = [answer for dealer in burst.answers for answer in dealer]
    assert len(answers) == 400  # each request its end marker
    # an answer is whole (a DEALER's answers never woven together) and bounded: the first 100 batches, or refused
    assert all(answer in ([], list(range(100))) for answer in answers)
    num_refused = sum(answer == [] for answer in answers)
    assert 0 < num_refused < 400 and pub.num_replays_refused == num_refused
    assert max(delays) < LIVE_BOUND_S


def test_an_answer_is_bounded_and_a_subscriber_catches_up_answer_after_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kv_replay, "REPLAY_ANSWER_BATCHES", 10)
    pub = KVEventPublisher(LOCAL, LOCAL, "kv@pod@model", 16)
    sub = _subscriber(pub)
    try:
        _fill(pub, sub, 30, num_tokens=16)
        assert sub.replay(0) == list(range(10))  # the first ten: it asks again from 10
        monkeypatch.setattr(kv_replay, "REPLAY_ANSWER_BYTES", 1)
        assert sub.replay(10) == [10]  # one batch at least, whatever its size
        monkeypatch.setattr(kv_replay, "REPLAY_ANSWER_BYTES", 1 << 20)
        late = _subscriber(pub)
        late.catch_up(pub.last_seq)
        index = late.index()
        late.close()
    finally:
        sub.close()
        pub.close()
    assert sorted(index.blocks) == list(range(1, 31)) and pub.num_replays_refused == 0


def test_a_subscriber_that_reads_none_of_its_answer_loses_it_and_frees_its_slot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kv_replay, "REPLAY_ACTIVE", 1)
    monkeypatch.setattr(kv_replay, "REPLAY_SEND_HWM", 4)
    monkeypatch.setattr(kv_replay, "REPLAY_STALL_S", 0.5)
    pub = KVEventPublisher(LOCAL, LOCAL, "kv@pod@model", 4096)
    sub = _subscriber(pub)
    ctx = zmq.Context()
    try:
        _fill(pub, sub, 300, num_tokens=4096)  # ~3.6 MB: more than the socket buffers hold
        slow = ctx.socket(zmq.DEALER)
        slow.setsockopt(zmq.RCVHWM, 1)
        slow.setsockopt(zmq.RCVBUF, 4096)
        slow.connect(pub.replay_endpoint or "")
        slow.send_multipart([b"", (0).to_bytes(8, "big")])  # takes the one slot, then reads nothing
        assert slow.poll(10_000)  # its answer began
        assert sub.replay(0) == []  # refused: the slot is taken
        _live_delay(pub, sub)
        deadline, num_refusals = time.monotonic() + 10, 0
        while (seqs := sub.replay(0)) == []:  # slow is cut after REPLAY_STALL_S: the slot serves the next
            num_refusals += 1
            assert time.monotonic() < deadline
        assert seqs == list(range(pub.last_seq + 1))
        assert pub.num_replays_refused == 1 + num_refusals + 1  # each refusal, and slow's answer cut
    finally:
        ctx.destroy(linger=0)
        sub.close()
        pub.close()


def test_the_payload_is_vllms_msgspec_encoding_byte_for_byte(monkeypatch: pytest.MonkeyPatch) -> None:
    # NOTE: msgspec.msgpack.encode (msgspec 0.22) of vLLM's array_like, tagged structs: KVEventBatch(ts=1.5,
    # events=[AllBlocksCleared()], data_parallel_rank=0), then KVEventBatch(ts=1.5, events=[BlockStored(
    # [2**64 - 1, 5], None, [1, 2, 3], 16, None, None, None), BlockRemoved([7], None)], data_parallel_rank=0)
    vllm = [
        "93cb3ff80000000000009191b0416c6c426c6f636b73436c656172656400",
        "93cb3ff80000000000009298ab426c6f636b53746f72656492cfffffffffffffffff05c09301020310c0c0c093ac426c6f636b52"
        "656d6f7665649107c000",
    ]
    monkeypatch.setattr(kv_events.time, "time", lambda: 1.5)
    pub = KVEventPublisher(LOCAL, LOCAL, "kv@pod@model", 16)
    sub = _subscriber(pub)
    try:
        pub.block_stored(-1, None, [1])  # -1: the 64 bits of 2**64 - 1
        pub.block_stored(5, -1, [2, 3])  # the chain goes on: one event
        pub.block_removed(7)
        pub.end_step()
        sub.catch_up(1)
    finally:
        sub.close()
        pub.close()
    assert [sub.batches[seq].hex() for seq in (0, 1)] == vllm
    assert sub.topics == {b"kv@pod@model"}


def test_topic_and_endpoint_rules() -> None:
    assert topic("10.0.0.7:8000", "SmolLM2") == "kv@10.0.0.7:8000@SmolLM2"
    assert topic(None, "m").startswith("kv@") and topic(None, "m").endswith("@m")
    assert is_bind("tcp://*:5557") and is_bind("tcp://0.0.0.0:5557") and is_bind("ipc:///tmp/kv")
    assert not is_bind("tcp://epp.default.svc:5557")  # a router's SUB that binds: connect to it


def test_a_busy_port_fails_at_start() -> None:
    pub = KVEventPublisher(LOCAL, None, "kv@pod@model", 16)
    try:
        with pytest.raises(OSError, match="kv_events"):
            KVEventPublisher(pub.endpoint.replace("127.0.0.1", "*"), None, "kv@pod@model", 16)
    finally:
        pub.close()


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="kv_events: needs enable_prefix_caching"):
        EngineConfig(kv_events=True, enable_prefix_caching=False)
    with pytest.raises(ValueError, match="kv_events_pod_id"):
        EngineConfig(kv_events=True, kv_events_pod_id="a@b")
    with pytest.raises(ValueError, match="kv_events_endpoint"):
        EngineConfig(kv_events=True, kv_events_endpoint="localhost:5557")


def test_events_off_cost_nothing_no_thread_no_socket() -> None:
    core, _ = fake_core(**SMALL_POOL)
    assert core.kv_events is None and core.block_manager.events is None
    assert not [t for t in threading.enumerate() if t.name == "infer-kv-events"]
    core.add_request("a", list(range(3, 40)), SamplingParams(max_tokens=4, temperature=0.0), lambda out: None)
    while core.has_work:
        core.step()
    assert len(core.block_manager.cached) == 2 and core.stats().num_kv_events_dropped_total == 0
    core.close()


def test_the_engines_snapshot_counts_the_refused_replays(core: EngineCore, monkeypatch: pytest.MonkeyPatch) -> None:
    assert core.kv_events is not None and core.stats().num_kv_replays_refused_total == 0
    monkeypatch.setattr(type(core.kv_events), "num_replays_refused", property(lambda _: 7))
    core.step()  # a step publishes the snapshot, with the publisher's count
    assert core.stats().num_kv_replays_refused_total == 7
