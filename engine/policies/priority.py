"""`priority`: the request's priority, aged by its waiting.

Every request has a standing, fixed when it arrives: `arrival_time_s + priority * priority_aging_s` (lower is
sooner). So one priority level is worth `priority_aging_s` seconds of waiting, the order of two requests never
changes while they wait or run (a preempted request keeps its place, and two requests cannot preempt each
other back and forth), and a request is outranked by no request that arrives more than
`(priority - MIN_PRIORITY) * priority_aging_s` after it: the aging bound.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Sequence

from infer.engine.policies.base import PolicySettings, R, SchedulingPolicy
from infer.engine.request import Request


class Priority(SchedulingPolicy):
    """Admission by standing; the least deserving running request yields, to a waiting request that outranks it."""

    def __init__(self, settings: PolicySettings) -> None:
        super().__init__(settings)
        self.aging_s = settings.priority_aging_s

    def standing(self, request: Request) -> float:
        """Lower is sooner; fixed for the request's life."""
        return request.arrival_time_s + request.params.priority * self.aging_s

    def rank(self, request: Request) -> tuple[float, ...]:
        """Lower is more deserving."""
        return (self.standing(request),)

    # the scheduler's questions
    def admission_order(self, waiting: Iterable[R]) -> Iterator[R]:
        """Most deserving first (of equals, in queue order). O(waiting) to start, O(log waiting) a request taken."""
        aging_s = self.aging_s
        # NOTE: the standing inlined: this runs over every waiting request every step
        queue = [(r.arrival_time_s + r.params.priority * aging_s, i, r) for i, r in enumerate(waiting)]
        heapq.heapify(queue)  # ties in queue order
        while queue:
            yield heapq.heappop(queue)[2]

    def victim(self, running: Sequence[R]) -> R:
        """The least deserving (of equals, the last admitted)."""
        return max(reversed(running), key=self.rank)

    def victim_for(self, waiting: Request, running: Sequence[R]) -> R | None:
        yielding = [r for r in running if self.outranks(waiting, r)]
        return self.victim(yielding) if yielding else None

    def outranks(self, waiting: Request, running: Request) -> bool:
        """Whether `running` yields its place to `waiting`: a better standing."""
        return self.standing(waiting) < self.standing(running)
