"""The engine's thread-safe inbox: requests and aborts from any thread, taken in by the step loop.

Requests and aborts share one queue, so an abort is taken in after the request it names (and an id
reused after an abort is not aborted in turn). Only requests are counted as waiting: a burst of
cancels must neither show as queued work nor fill the queue bound.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

from infer.engine.request import Request, RequestOutput
from infer.engine.validation import check

Sink = Callable[[RequestOutput], None]
Item = tuple[Request, Sink] | str  # a new request, or the id of one to abort


class QueueFullError(RuntimeError):
    """The waiting queue holds max_waiting_requests already; retry later."""


class Inbox:
    """Bounds the queue (requests accepted but not yet scheduled) and refuses ids already in flight."""

    def __init__(self, max_waiting_requests: int) -> None:
        self.max_waiting_requests = max_waiting_requests
        self._items: queue.SimpleQueue[Item] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self.num_queued = 0  # accepted but not yet scheduled: bounded by max_waiting_requests
        self.num_unseen = 0  # requests still here (not yet seen by the scheduler); aborts are not counted
        self.num_unseen_tokens = 0  # their prompt tokens
        self._ids_in_flight: set[str] = set()

    def add(self, request: Request, sink: Sink) -> None:
        """Enqueue; ValueError for an id in flight, QueueFullError when the queue is full."""
        rid = request.request_id
        with self._lock:
            check("request_id", rid not in self._ids_in_flight, f"{rid!r} is already in flight")
            if self.num_queued >= self.max_waiting_requests:
                raise QueueFullError(f"{self.num_queued} requests are waiting (max_waiting_requests)")
            self.num_queued += 1
            self.num_unseen += 1
            self.num_unseen_tokens += request.num_prompt_tokens
            self._ids_in_flight.add(rid)
        self._items.put((request, sink))

    def abort(self, request_id: str) -> None:
        self._items.put(request_id)

    def take(self) -> list[Item]:
        """Everything that arrived, in order (the step loop's side)."""
        items = []
        while not self._items.empty():
            items.append(self._items.get_nowait())
        return items

    def scheduled(self, request: Request) -> None:
        """The scheduler has `request` now: it and its tokens are counted there."""
        with self._lock:
            self.num_unseen -= 1
            self.num_unseen_tokens -= request.num_prompt_tokens

    def count_waiting(self, num_never_scheduled: int) -> None:
        """Requests the scheduler holds but never scheduled still count against the queue bound."""
        with self._lock:
            self.num_queued = num_never_scheduled + self.num_unseen

    def done(self, request_id: str) -> None:
        """The request ended: its id may be used again."""
        with self._lock:
            self._ids_in_flight.discard(request_id)

    @property
    def has_items(self) -> bool:
        return not self._items.empty()
