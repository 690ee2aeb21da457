"""The engine's inbox: what counts against the queue bound, what an abort does, and what other threads read."""

from __future__ import annotations

import dataclasses
import time

import pytest

from infer.engine.inbox import Inbox, QueueFullError
from infer.engine.request import Request
from infer.engine.sampling_params import SamplingParams
from infer.engine.stats import EngineStats

IDLE = EngineStats(0, 0, 0, 16, 0, 0, 0, 0, 0.0, 0)  # an engine with 16 free blocks and nothing to do


def _request(request_id: str, num_tokens: int = 3) -> Request:
    return Request(request_id, list(range(3, 3 + num_tokens)), SamplingParams(), time.monotonic())


def test_pending_aborts_neither_count_as_waiting_nor_fill_the_queue() -> None:
    inbox: Inbox[Request] = Inbox(4, IDLE)
    inbox.add(_request("a", 5))
    inbox.abort("a")
    for i in range(100):  # a burst of cancels of requests that are not in flight
        inbox.abort(f"gone-{i}")
    stats = inbox.stats()
    assert (stats.num_waiting, stats.num_queued, stats.queued_tokens) == (1, 1, 5)
    for rid in ("b", "c", "d"):  # room for three more: the aborts take none of it
        inbox.add(_request(rid))
    with pytest.raises(QueueFullError, match="4 requests are waiting"):
        inbox.add(_request("e"))
    assert inbox.take()[1] == {"a"}  # only the abort of a request in flight is kept


def test_an_abort_is_taken_in_with_the_request_it_names() -> None:
    inbox: Inbox[Request] = Inbox(4, IDLE)
    first = _request("x")
    inbox.add(first)
    inbox.abort("x")
    new, aborts = inbox.take()
    assert new == [first] and aborts == {"x"}  # the core takes the request in, then ends it
    assert not inbox.has_items


def test_a_stale_abort_never_ends_a_request_that_reuses_the_id() -> None:
    inbox: Inbox[Request] = Inbox(4, IDLE)
    inbox.add(_request("x"))
    inbox.take()
    inbox.abort("x")  # the caller cancels while the request finishes on its own
    inbox.release("x")  # it ended: the id is free, the cancel is moot
    again = _request("x")
    inbox.add(again)
    with pytest.raises(ValueError, match="already in flight"):
        inbox.add(_request("x"))
    assert inbox.take() == ([again], set())
    inbox.abort("never-sent")
    assert not inbox.has_items


def test_stats_count_each_request_once_from_arrival_to_the_snapshot_that_shows_it() -> None:
    inbox: Inbox[Request] = Inbox(8, IDLE)
    inbox.add(_request("a", 4))
    inbox.add(_request("b", 6))
    assert inbox.stats().num_waiting == 2 and inbox.stats().queued_tokens == 10
    inbox.take()  # the step loop has them, but has not published yet: still counted here
    assert inbox.stats().num_waiting == 2 and inbox.stats().queued_tokens == 10
    # the step scheduled a, which computed 4 prompt tokens and has 1 to go; b waits, never scheduled
    after = dataclasses.replace(IDLE, num_waiting=1, num_running=1, queued_tokens=7, num_queued=1)
    inbox.publish(after)
    assert inbox.stats() == after
    assert inbox.num_queued == 1
