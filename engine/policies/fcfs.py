"""`fcfs` (the default): arrival order."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import ClassVar

from infer.engine.policies.base import R, SchedulingPolicy
from infer.engine.request import Request


class Fcfs(SchedulingPolicy):
    """Waiting requests are admitted in queue order (a preempted request goes back first) and nobody overtakes
    the head; the most recently admitted running request is the one preempted; priorities and tenants are
    ignored."""

    allows_static_batching: ClassVar[bool] = True

    def admission_order(self, waiting: Iterable[R]) -> Iterator[R]:
        return iter(waiting)

    def victim(self, running: Sequence[R]) -> R:
        return running[-1]

    def victim_for(self, waiting: Request, running: Sequence[R]) -> R | None:
        return None  # a waiting request waits for room
