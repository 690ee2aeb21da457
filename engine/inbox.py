"""The engine core's thread boundary: requests and aborts in from any thread, the step snapshot out.

New requests queue in arrival order. An abort is not a queue entry: it marks a request in flight to be
ended at the next step, and is dropped with the request's id when the request ends (so an id reused
later is never aborted by a stale cancel). After each step the stepping thread publishes an immutable
`EngineStats`; readers on other threads get that snapshot plus the requests it does not show yet, read
together under one lock, so no reader sees a request twice, or not at all, or the scheduler's lists.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Generic, TypeVar

from infer.engine.request import Request
from infer.engine.stats import EngineStats
from infer.engine.validation import QueueFullError as QueueFullError  # the waiting queue's error too
from infer.engine.validation import Refusal, check

R = TypeVar("R", bound=Request)


class Inbox(Generic[R]):
    """Bounds the queue (requests accepted but not yet scheduled) and refuses ids already in flight."""

    def __init__(self, max_waiting_requests: int, snapshot: EngineStats) -> None:
        self.max_waiting_requests = max_waiting_requests
        self._lock = threading.Lock()
        self._arrived = threading.Event()
        self._new: list[R] = []  # added, not yet taken in by the stepping thread
        self._taken: list[R] = []  # taken in, not yet in a published snapshot
        self._num_unseen_tokens = 0  # prompt tokens of both
        self._aborts: set[str] = set()  # ids in flight to end at the next step
        self._ids_in_flight: set[str] = set()
        self._snapshot = snapshot

    # any thread
    def add(self, request: R) -> None:
        """Enqueue; ValueError for an id in flight, QueueFullError when the queue is full."""
        rid = request.request_id
        with self._lock:
            is_new = rid not in self._ids_in_flight
            check("request_id", is_new, f"{rid!r} is already in flight", Refusal.DUPLICATE_ID)
            num_queued = self._num_queued()
            if num_queued >= self.max_waiting_requests:
                raise QueueFullError(f"{num_queued} requests are waiting (max_waiting_requests)")
            self._ids_in_flight.add(rid)
            self._new.append(request)
            self._num_unseen_tokens += request.num_prompt_tokens
        self._arrived.set()

    def abort(self, request_id: str) -> None:
        """End the request at the next step; an id not in flight is ignored (it ended, or never came)."""
        with self._lock:
            if request_id not in self._ids_in_flight:
                return
            self._aborts.add(request_id)
        self._arrived.set()

    def stats(self) -> EngineStats:
        """The last published snapshot, with the requests it does not show yet counted as waiting."""
        with self._lock:
            s, num_unseen = self._snapshot, len(self._new) + len(self._taken)
            return dataclasses.replace(
                s,
                num_waiting=s.num_waiting + num_unseen,
                num_queued=s.num_queued + num_unseen,
                queued_tokens=s.queued_tokens + self._num_unseen_tokens,
            )

    @property
    def num_queued(self) -> int:
        """Requests accepted but never scheduled: bounded by max_waiting_requests."""
        with self._lock:
            return self._num_queued()

    def is_in_flight(self, request_id: str) -> bool:
        with self._lock:
            return request_id in self._ids_in_flight

    def wake(self) -> None:
        """Return from `wait` at once."""
        self._arrived.set()

    # the stepping thread
    def take(self) -> tuple[list[R], set[str]]:
        """The requests that arrived, in order, and the ids to abort (after those requests are taken in)."""
        with self._lock:
            new, aborts = self._new, self._aborts
            self._new, self._aborts = [], set()
            self._taken += new
        return new, aborts

    def release(self, request_id: str) -> None:
        """The request ended: its id may be used again, and a pending abort of it is moot."""
        with self._lock:
            self._ids_in_flight.discard(request_id)
            self._aborts.discard(request_id)

    def publish(self, snapshot: EngineStats) -> None:
        """The engine's state after a step: it shows every request taken in so far."""
        with self._lock:
            self._snapshot = snapshot
            self._num_unseen_tokens -= sum(r.num_prompt_tokens for r in self._taken)
            self._taken = []

    def wait(self, timeout_s: float | None) -> None:
        """Block until a request or an abort arrives (or `wake`), at most timeout_s."""
        self._arrived.wait(timeout_s)
        self._arrived.clear()

    @property
    def has_items(self) -> bool:
        with self._lock:
            return bool(self._new or self._aborts)

    def _num_queued(self) -> int:
        return self._snapshot.num_queued + len(self._new) + len(self._taken)
