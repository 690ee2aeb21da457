"""KV-cache events: every block the prefix cache stores or evicts, published over ZMQ in vLLM's layout.

The wire format is vLLM's `ZmqEventPublisher` (vllm/distributed/kv_events.py), which llm-d's router decodes
(pkg/kvevents), so its precise prefix scorer needs no adapter:

- a PUB socket sends multipart [topic, seq, payload]: topic `kv@<pod-id>@<model>`, seq an 8-byte big-endian
  batch number counted from 0, payload a msgpack array [ts, events, data_parallel_rank];
- each event is an array tagged by its name first (msgspec's `array_like=True, tag=True` structs):
  ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name],
  ["BlockRemoved", block_hashes, medium], ["AllBlocksCleared"];
- a ROUTER replay socket answers a request [b"", seq] (8 bytes, big-endian) with [b"", topic, seq, payload] for
  the batches it still holds from seq on, then the end marker [b"", b"", -1 (8 bytes), b""]. A request for a
  batch no longer held gets the batches that are (the first one numbered above the one asked: the gap says what
  was lost); a malformed request gets the end marker alone. Answers are bounded in size and served in bounded
  turns between live batches, and a burst beyond the bounds is refused (engine/kv_replay.py).

A block hash is the prefix cache's own (`BlockManager`: Python's hash of the parent hash and the block's tokens),
its 64 bits read as unsigned. medium is None: the engine's own KV pool, which consumers take as the GPU tier.

The step never waits on the network: it appends one batch a step to a bounded queue that a thread sends
(non-blocking sends; a PUB socket drops for a subscriber that does not read, which sees a sequence gap and can
replay). Each turn of the thread sends every queued batch first, then one bounded turn of replays, so live events
never wait behind a burst of replay requests. When the queue is full the oldest batch is dropped and counted
(`num_dropped`); the next batch sent then begins with AllBlocksCleared, so a subscriber forgets what the lost
events might have changed rather than keep blocks this pod no longer holds. The first batch (seq 0) is
AllBlocksCleared: a new process holds nothing.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import msgpack
import zmq

from infer.engine.kv_replay import Replays

logger = logging.getLogger(__name__)

HASH_MASK = (1 << 64) - 1
QUEUE_BATCHES = 4096  # batches (one a step) waiting for the publisher thread; more: the oldest is dropped
SEND_HWM = 100_000  # messages ZMQ queues for one subscriber before dropping for it (vLLM's hwm)
CLEARED: list[Any] = ["AllBlocksCleared"]


def wire_hash(block_hash: int) -> int:
    """A prefix-cache block hash as published: its 64 bits read as unsigned."""
    return block_hash & HASH_MASK


def topic(pod_id: str | None, model: str) -> str:
    """`kv@<pod-id>@<model>`; the pod id defaults to the host name (a Kubernetes pod's name)."""
    return f"kv@{pod_id or socket.gethostname()}@{model}"


def is_bind(endpoint: str) -> bool:
    """vLLM's rule: bind a wildcard address (`*`, 0.0.0.0, ::) or an ipc/inproc one; connect to any other."""
    host = endpoint.partition("://")[2].rpartition(":")[0]
    return "*" in endpoint or host in ("0.0.0.0", "::", "[::]") or endpoint.startswith(("ipc://", "inproc://"))


class KVEventPublisher:
    """The step records events (`block_stored`, `block_removed`) and ends its batch (`end_step`); a thread sends.

    Sockets are made (and bound: a busy port fails here) by the constructor, then used by the thread alone."""

    def __init__(self, endpoint: str, replay_endpoint: str | None, topic: str, block_size: int) -> None:
        self.topic, self.block_size = topic.encode(), block_size
        self.num_dropped = 0  # events dropped before they were sent (the queue was full)
        self._pending: list[list[Any]] = []  # this step's events
        self._queue: deque[tuple[int, float, list[list[Any]]]] = deque(maxlen=QUEUE_BATCHES)
        self._lock, self._wake, self._closing = threading.Lock(), threading.Event(), False
        self._next_seq = 0
        self._ctx = zmq.Context()
        self._pub, self._replays = self._ctx.socket(zmq.PUB), None
        try:
            self._pub.setsockopt(zmq.SNDHWM, SEND_HWM)
            self._pub.setsockopt(zmq.LINGER, 0)
            if is_bind(endpoint):
                self._pub.bind(endpoint)
            else:
                self._pub.connect(endpoint)
            if replay_endpoint is not None:
                replay = self._ctx.socket(zmq.ROUTER)
                replay.setsockopt(zmq.LINGER, 0)
                self._replays = Replays(replay, self.topic)  # sets its options: before the bind, which copies them
                replay.bind(replay_endpoint)
        except zmq.ZMQError as e:
            self._ctx.destroy(linger=0)
            raise OSError(f"kv_events: cannot open {endpoint} / {replay_endpoint}: {e}") from None
        self.endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT) or endpoint
        self.replay_endpoint = self._replays.socket.getsockopt_string(zmq.LAST_ENDPOINT) if self._replays else None
        self._pending.append(CLEARED)
        self.end_step()
        self._thread = threading.Thread(target=self._run, name="infer-kv-events", daemon=True)
        self._thread.start()
        logger.info("KV-cache events on %s (replay %s), topic %s", self.endpoint, self.replay_endpoint, topic)

    @property
    def last_seq(self) -> int:
        """The number of the last batch the step handed over (the engine thread's view)."""
        return self._next_seq - 1

    @property
    def num_replays_refused(self) -> int:
        """Replay requests refused (beyond the bounds: the end marker alone) or cut (the subscriber stalled)."""
        return self._replays.num_refused if self._replays is not None else 0

    # the step's side (the engine thread)
    def block_stored(self, block_hash: int, parent_hash: int | None, token_ids: Sequence[int]) -> None:
        h = wire_hash(block_hash)
        parent = None if parent_hash is None else wire_hash(parent_hash)
        last = self._pending[-1] if self._pending else CLEARED
        if last[0] == "BlockStored" and parent is not None and last[1][-1] == parent:  # the chain goes on
            last[1].append(h)
            last[3].extend(token_ids)
        else:
            self._pending.append(["BlockStored", [h], parent, list(token_ids), self.block_size, None, None, None])

    def block_removed(self, block_hash: int) -> None:
        last = self._pending[-1] if self._pending else CLEARED
        if last[0] == "BlockRemoved":
            last[1].append(wire_hash(block_hash))
        else:
            self._pending.append(["BlockRemoved", [wire_hash(block_hash)], None])

    def end_step(self) -> None:
        """Hand this step's events to the thread as one batch; never waits (a full queue drops its oldest)."""
        if not self._pending:
            return
        events, self._pending = self._pending, []
        with self._lock:
            if len(self._queue) == self._queue.maxlen:
                self.num_dropped += len(self._queue[0][2])
            self._queue.append((self._next_seq, time.time(), events))
            self._next_seq += 1
        self._wake.set()

    def close(self) -> None:
        """Send what is queued, stop the thread, close the sockets."""
        self._closing = True
        self._wake.set()
        self._thread.join(timeout=5)
        self._ctx.destroy(linger=0)

    # the publisher thread
    def _run(self) -> None:
        last_seq, wait_s = -1, None
        while True:
            self._wake.wait(wait_s)
            self._wake.clear()
            last_seq = self._send_queued(last_seq)  # live first
            if self._closing:
                return
            if self._replays is not None:
                wait_s = self._replays.turn()  # then one bounded turn of replays

    def _send_queued(self, last_seq: int) -> int:
        """Send every batch the step queued; the number of the last."""
        with self._lock:
            batches = list(self._queue)
            self._queue.clear()
        for seq, ts, events in batches:
            if seq != last_seq + 1:  # batches were dropped: subscribers forget what they may have changed
                events = [CLEARED, *events]
            self._send(seq, ts, events)
            last_seq = seq
        return last_seq

    def _send(self, seq: int, ts: float, events: list[list[Any]]) -> None:
        payload: bytes = msgpack.packb([ts, events, 0])
        seq_bytes = seq.to_bytes(8, "big")
        try:
            self._pub.send_multipart([self.topic, seq_bytes, payload], flags=zmq.NOBLOCK)
        except zmq.Again:  # NOTE: a PUB socket drops rather than block; a connecting one may not
            logger.debug("KV-cache event batch %d not sent (no peer ready); it stays replayable", seq)
        if self._replays is not None:
            self._replays.hold(seq, payload)
