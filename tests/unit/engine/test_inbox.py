"""The engine's inbox: what counts against the queue bound, and what is taken in, in which order."""

from __future__ import annotations

import time

import pytest

from infer.engine.inbox import Inbox, QueueFullError
from infer.engine.request import Request, RequestOutput
from infer.engine.sampling_params import SamplingParams


def _request(request_id: str, num_tokens: int = 3) -> Request:
    return Request(request_id, list(range(3, 3 + num_tokens)), SamplingParams(), time.monotonic())


def _sink(out: RequestOutput) -> None:
    pass


def test_pending_aborts_neither_count_as_waiting_nor_fill_the_queue() -> None:
    inbox = Inbox(max_waiting_requests=4)
    inbox.add(_request("a", 5), _sink)
    for i in range(100):  # a burst of cancels, not yet taken in by the step loop
        inbox.abort(f"gone-{i}")
    assert inbox.num_unseen == 1 and inbox.num_unseen_tokens == 5
    inbox.count_waiting(num_never_scheduled=0)  # what the step loop does after each schedule
    assert inbox.num_queued == 1
    for rid in ("b", "c", "d"):  # room for three more: the aborts take none of it
        inbox.add(_request(rid), _sink)
    with pytest.raises(QueueFullError, match="4 requests are waiting"):
        inbox.add(_request("e"), _sink)


def test_an_abort_is_taken_in_after_the_request_it_names() -> None:
    inbox = Inbox(max_waiting_requests=4)
    first = _request("x")
    inbox.add(first, _sink)
    inbox.abort("x")
    items = inbox.take()
    assert [item if isinstance(item, str) else item[0].request_id for item in items] == ["x", "x"]
    assert isinstance(items[0], tuple) and items[1] == "x"
    inbox.scheduled(first)
    assert inbox.num_unseen == 0 and inbox.num_unseen_tokens == 0 and not inbox.has_items
